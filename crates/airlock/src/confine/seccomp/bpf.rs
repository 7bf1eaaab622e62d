//! Classic BPF as the two filters airlock compiles itself ([`super::table`],
//! [`super::arguments`]) write it: the opcodes they use, the `seccomp_data` offsets, the
//! instruction constructors, and (for tests) an evaluator that runs a program as the kernel
//! would.

use seccompiler::sock_filter;

// Opcodes (linux/filter.h) and `seccomp_data` offsets (linux/seccomp.h).
pub const LD_W_ABS: u16 = 0x20;
pub const ALU_AND_K: u16 = 0x54;
pub const JMP_JA: u16 = 0x05;
pub const JMP_JEQ_K: u16 = 0x15;
pub const JMP_JGE_K: u16 = 0x35;
pub const JMP_JSET_K: u16 = 0x45;
pub const RET_K: u16 = 0x06;
pub const SYSCALL_NR_OFFSET: u32 = 0;
pub const ARCH_OFFSET: u32 = 4;
pub const ARGS_OFFSET: u32 = 16;

pub fn statement(code: u16, k: u32) -> sock_filter {
    sock_filter {
        code,
        jt: 0,
        jf: 0,
        k,
    }
}

pub fn jump(code: u16, k: u32, jt: u8, jf: u8) -> sock_filter {
    sock_filter { code, jt, jf, k }
}

#[cfg(test)]
pub mod tests {
    use super::*;

    /// The input of one evaluation: `seccomp_data`'s number, arch and arguments.
    pub struct Data {
        pub nr: u32,
        pub arch: u32,
        pub args: [u64; 6],
    }

    impl Data {
        /// A call with every argument zero.
        pub fn number(nr: u32, arch: u32) -> Data {
            Data {
                nr,
                arch,
                args: [0; 6],
            }
        }

        fn word(&self, offset: u32) -> u32 {
            match offset {
                SYSCALL_NR_OFFSET => self.nr,
                ARCH_OFFSET => self.arch,
                _ => {
                    let (index, high) = ((offset - ARGS_OFFSET) / 8, (offset - ARGS_OFFSET) % 8);
                    let value = self.args[index as usize];
                    match high == 4 {
                        true => (value >> 32) as u32,
                        false => value as u32,
                    }
                }
            }
        }
    }

    /// Runs a program of the instructions seccompiler and airlock's compilers emit over one
    /// input, as the kernel would (little-endian argument words). Panics on any other
    /// instruction, or on a program that runs off its end or loops.
    pub fn evaluate(program: &[sock_filter], data: &Data) -> u32 {
        let (mut pc, mut acc) = (0usize, 0u32);
        for _ in 0..program.len() {
            let insn = &program[pc];
            pc += 1;
            let taken = match insn.code {
                LD_W_ABS => {
                    acc = data.word(insn.k);
                    continue;
                }
                ALU_AND_K => {
                    acc &= insn.k;
                    continue;
                }
                RET_K => return insn.k,
                JMP_JA => {
                    pc += insn.k as usize;
                    continue;
                }
                JMP_JEQ_K => acc == insn.k,
                JMP_JGE_K => acc >= insn.k,
                JMP_JSET_K => acc & insn.k != 0,
                other => panic!("unexpected instruction {other:#x}"),
            };
            pc += usize::from(if taken { insn.jt } else { insn.jf });
        }
        panic!("the program ran off its end or looped")
    }
}
