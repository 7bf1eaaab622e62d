"""Spins on the CPU forever, in two threads.

usage: cpu_loop.py
"""
import threading


def spin():
    while True:
        pass


threading.Thread(target=spin, daemon=True).start()
spin()
