//! Times warm runs of a program from one process: `cargo run --release --example
//! warm_latency -- N PROGRAM [ARGS...]` (the init is `AIRLOCK_INIT`, else target/release/airlock).

use std::time::{Duration, Instant};

fn main() {
    let mut args = std::env::args().skip(1);
    let runs: usize = args.next().and_then(|n| n.parse().ok()).unwrap_or(20);
    let argv: Vec<String> = args.collect();
    let argv = if argv.is_empty() {
        vec!["/bin/true".to_string()]
    } else {
        argv
    };
    let init = std::env::var_os("AIRLOCK_INIT")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| {
            concat!(env!("CARGO_MANIFEST_DIR"), "/../../target/release/airlock").into()
        });
    let options = airlock::SandboxOptions {
        init_program: Some(init),
        ..Default::default()
    };
    let policy = airlock::policy::load_profile("untrusted").expect("profile");
    let sandbox = airlock::Sandbox::with_options(policy, options).expect("sandbox");
    let pool = sandbox
        .warm(airlock::warm::WarmOptions::new(2))
        .expect("pool");
    let mut times = Vec::new();
    for _ in 0..runs {
        pool.wait_settled(Duration::from_secs(30));
        let start = Instant::now();
        let result = pool
            .command(argv[0].clone())
            .args(argv[1..].iter().cloned())
            .discard_output()
            .run()
            .expect("run");
        times.push(start.elapsed());
        assert!(result.success(), "{result:?}");
    }
    times.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    println!(
        "{runs} warm runs of {}: median {:.2} ms, min {:.2} ms, max {:.2} ms",
        argv.join(" "),
        ms(times[runs / 2]),
        ms(times[0]),
        ms(times[runs - 1])
    );
}
