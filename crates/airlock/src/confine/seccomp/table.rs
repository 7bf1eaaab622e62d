//! A seccomp program that maps syscall numbers to actions by binary search.
//!
//! seccompiler compiles a rule set into a linear chain of comparisons: our allowlist of about
//! 330 syscalls became 1,330 instructions, which the kernel took about 0.7 ms to load (classic
//! BPF is checked, converted and JIT-compiled on every load: once per run, twice under bwrap)
//! and which every syscall walked until its number matched. Most of the table is runs of
//! neighbouring numbers with the same action, so this program merges those runs into ranges
//! and finds a syscall's range by binary search: a few dozen ranges, about 150 instructions
//! and about ten of them per syscall. seccompiler has no such mode; the rules that
//! inspect arguments are a second program ([`super::arguments`]).

use std::collections::BTreeMap;

use seccompiler::{sock_filter, BpfProgram};

use super::bpf::*;

/// A conditional jump's offsets are 8 bits wide.
const MAX_SHORT_JUMP: usize = u8::MAX as usize;

/// What the kernel should return for each syscall number.
#[derive(Debug, Clone)]
pub struct SyscallTable {
    /// The `AUDIT_ARCH_*` token the numbers belong to.
    pub arch: u32,
    /// The seccomp return value (`SECCOMP_RET_*` with its data) per listed number.
    pub actions: BTreeMap<u32, u32>,
    /// The return value for every number not listed.
    pub default: u32,
    /// The return value for a syscall made under another architecture token (e.g. i386 calls
    /// via `int 0x80` on x86_64), whose numbers mean other syscalls.
    pub foreign_arch: u32,
}

/// A run of consecutive syscall numbers, starting at `first`, that share one action; it ends
/// where the next range starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Range {
    first: u32,
    action: u32,
}

impl SyscallTable {
    /// The program: an architecture check, then a binary search over the ranges. The first
    /// three instructions are "load arch; if arch == ours skip 1; return foreign_arch", as in
    /// seccompiler's programs.
    pub fn compile(&self) -> BpfProgram {
        let mut program = vec![
            statement(LD_W_ABS, ARCH_OFFSET),
            jump(JMP_JEQ_K, self.arch, 1, 0),
            statement(RET_K, self.foreign_arch),
            statement(LD_W_ABS, SYSCALL_NR_OFFSET),
        ];
        program.extend(search(&self.ranges()));
        program
    }

    /// Every number from 0 to `u32::MAX` falls in exactly one range; neighbours differ.
    fn ranges(&self) -> Vec<Range> {
        let mut ranges = vec![Range {
            first: 0,
            action: self.default,
        }];
        let mut push = |first: u32, action: u32| match ranges.last_mut() {
            Some(last) if last.first == first => last.action = action,
            Some(last) if last.action == action => {}
            _ => ranges.push(Range { first, action }),
        };
        for (&number, &action) in &self.actions {
            push(number, action);
            if let Some(next) = number.checked_add(1) {
                if !self.actions.contains_key(&next) {
                    push(next, self.default);
                }
            }
        }
        ranges
    }
}

/// The code that returns the action of the range the accumulator (the syscall number) is in.
fn search(ranges: &[Range]) -> Vec<sock_filter> {
    if let [only] = ranges {
        return vec![statement(RET_K, only.action)];
    }
    let (low, high) = ranges.split_at(ranges.len() / 2);
    let below = search(low);
    let at_or_above = search(high);
    let split = high[0].first;
    let mut code = if below.len() <= MAX_SHORT_JUMP {
        vec![jump(JMP_JGE_K, split, below.len() as u8, 0)]
    } else {
        // Too far for a conditional jump: hop over an unconditional one instead.
        vec![
            jump(JMP_JGE_K, split, 0, 1),
            statement(JMP_JA, below.len() as u32),
        ]
    };
    code.extend(below);
    code.extend(at_or_above);
    code
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// Runs a program over one `seccomp_data` of a number and an arch.
    pub fn evaluate(program: &[sock_filter], nr: u32, arch: u32) -> u32 {
        super::super::bpf::tests::evaluate(
            program,
            &super::super::bpf::tests::Data::number(nr, arch),
        )
    }

    const ARCH: u32 = 0xc000_003e;
    const ALLOW: u32 = 0x7fff_0000;
    const EPERM: u32 = 0x0005_0001;
    const ENOSYS: u32 = 0x0005_0026;

    fn table(actions: &[(u32, u32)]) -> SyscallTable {
        SyscallTable {
            arch: ARCH,
            actions: actions.iter().copied().collect(),
            default: ENOSYS,
            foreign_arch: EPERM,
        }
    }

    fn expected(table: &SyscallTable, nr: u32) -> u32 {
        table.actions.get(&nr).copied().unwrap_or(table.default)
    }

    /// Numbers around every listed one, plus the extremes.
    fn interesting_numbers(table: &SyscallTable) -> Vec<u32> {
        let mut numbers = vec![0, 1, 0x4000_0000, u32::MAX - 1, u32::MAX];
        for &nr in table.actions.keys() {
            numbers.extend([nr.saturating_sub(1), nr, nr.saturating_add(1)]);
        }
        numbers
    }

    #[test]
    fn every_number_gets_its_action_or_the_default() {
        let tables = [
            table(&[]),
            table(&[(0, ALLOW)]),
            table(&[(u32::MAX, ALLOW)]),
            table(&[(3, ALLOW), (4, ALLOW), (5, EPERM), (9, ALLOW), (10, ENOSYS)]),
        ];
        for table in tables {
            let program = table.compile();
            for nr in interesting_numbers(&table) {
                assert_eq!(
                    evaluate(&program, nr, ARCH),
                    expected(&table, nr),
                    "{nr} in {table:?}"
                );
            }
        }
    }

    #[test]
    fn a_foreign_architecture_gets_its_own_action() {
        let table = table(&[(1, ALLOW)]);
        assert_eq!(evaluate(&table.compile(), 1, 0x4000_0003), EPERM);
    }

    #[test]
    fn runs_of_numbers_become_one_range() {
        let actions: Vec<(u32, u32)> = (0..300).map(|nr| (nr, ALLOW)).collect();
        let ranges = table(&actions).ranges();
        let starts: Vec<u32> = ranges.iter().map(|r| r.first).collect();
        assert_eq!(starts, [0, 300]);
    }

    /// A table whose subtrees outgrow an 8-bit jump still evaluates correctly.
    #[test]
    fn long_jumps_are_bridged() {
        let actions: Vec<(u32, u32)> = (0..2000)
            .map(|i| (i * 2, if i % 3 == 0 { EPERM } else { ALLOW }))
            .collect();
        let table = table(&actions);
        let program = table.compile();
        assert!(program.iter().any(|insn| insn.code == JMP_JA));
        for nr in interesting_numbers(&table) {
            assert_eq!(evaluate(&program, nr, ARCH), expected(&table, nr), "{nr}");
        }
    }
}
