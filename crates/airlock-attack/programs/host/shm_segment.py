"""Host-side helper (not an attack): creates or removes the System V segment sysv_shm.py hunts.

usage: shm_segment.py create KEY SECRET   (prints the segment id)
       shm_segment.py remove SHMID
"""
import ctypes
import sys

libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
IPC_CREAT, IPC_EXCL, IPC_RMID = 0o1000, 0o2000, 0

if sys.argv[1] == "create":
    key, secret = int(sys.argv[2]), sys.argv[3].encode()
    shmid = libc.shmget(ctypes.c_int(key), ctypes.c_size_t(4096), ctypes.c_int(IPC_CREAT | IPC_EXCL | 0o644))
    if shmid < 0:
        sys.exit(f"shmget: errno {ctypes.get_errno()}")
    address = libc.shmat(ctypes.c_int(shmid), None, ctypes.c_int(0))
    ctypes.memmove(address, secret, len(secret))
    libc.shmdt(ctypes.c_void_p(address))
    print(shmid)
else:
    libc.shmctl(ctypes.c_int(int(sys.argv[2])), ctypes.c_int(IPC_RMID), None)
