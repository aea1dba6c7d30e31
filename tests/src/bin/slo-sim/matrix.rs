//! The matrix: the shipped SLO configuration (`--slo-config`) against the filter's
//! default profile, cell by cell. A cell is a pool shape (servers, speed spread, engine
//! step jitter), an arrival shape (steady, bursts, a step up and down), an interactive
//! share (the rest relaxed) and a seed; both sides get the identical request sequence.
//! Per cell: each side's goodput (requests meeting both SLOs per measured second) and
//! each class's attainment; per (pool, arrival, share) over the seeds: the goodput ratio
//! SLO ÷ default (mean, min–max), the ceiling (every request sent meeting its SLO ÷ the
//! default's goodput) and the goals:
//!
//! * **G1** the SLO profile's goodput is not below the default's by more than the seed
//!   spread: mean ratio ≥ 1 − (max − min) / 2 over the seeds;
//! * **G2** where the default's interactive attainment is ≤ 85 %: mean ratio ≥ 1.15;
//! * **G3** no class loses more than 5 points of attainment unless the other gains more
//!   points than it loses.

use super::{observed, requests, trace, world, Args, CLASSES};
use host_sim::{Nanos, MS, SEC};
use serde_json::{json, Value};
use std::time::Instant;

/// One (row, seed) run of the matrix: the row's index, its arguments, the arrival steps
/// ([`Arrival::steps`]) and the arrival shape.
type Run = (usize, Args, Vec<(f64, f64)>, Arrival);

/// A pool shape.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Pool {
    /// Servers.
    pub servers: usize,
    /// The slowest server is this many times slower than the fastest (1 = uniform).
    pub ratio: f64,
    /// Engine step jitter (std of a Normal(1, J)); 0 = none.
    pub jitter: f64,
}

impl Pool {
    /// Each server's slowdown: evenly from 1× to `ratio`×.
    pub fn speeds(&self) -> Vec<f64> {
        let n = self.servers.max(1);
        (0..n)
            .map(|i| {
                if n == 1 {
                    1.0
                } else {
                    1.0 + (self.ratio - 1.0) * i as f64 / (n - 1) as f64
                }
            })
            .collect()
    }

    fn name(&self) -> String {
        let jitter = if self.jitter > 0.0 {
            format!("jitter {}", self.jitter)
        } else {
            "no jitter".into()
        };
        format!("{} × 1–{}×, {jitter}", self.servers, self.ratio)
    }
}

/// An arrival shape.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Arrival {
    /// Poisson at the cell's QPS throughout.
    Steady,
    /// 0.7× the cell's QPS with a burst of 4 s at 2.2× every 20 s (the same mean).
    Burst,
    /// 0.7× through the warm-up and the window's first third, 1.6× in the second, 0.7×
    /// in the last.
    Step,
}

impl Arrival {
    fn name(self) -> &'static str {
        match self {
            Arrival::Steady => "steady",
            Arrival::Burst => "burst",
            Arrival::Step => "step",
        }
    }

    /// The (QPS, seconds) steps of a cell at `qps` with `warmup` + `seconds`.
    pub fn steps(self, qps: f64, warmup: f64, seconds: f64) -> Vec<(f64, f64)> {
        let total = warmup + seconds;
        match self {
            Arrival::Steady => vec![(qps, total)],
            Arrival::Burst => {
                let mut out = Vec::new();
                let mut t = 0.0;
                while t < total {
                    let base = (total - t).min(BURST_EVERY - BURST_LEN);
                    out.push((0.7 * qps, base));
                    t += base;
                    if t < total {
                        let burst = (total - t).min(BURST_LEN);
                        out.push((2.2 * qps, burst));
                        t += burst;
                    }
                }
                out
            }
            Arrival::Step => vec![
                (0.7 * qps, warmup + seconds / 3.0),
                (1.6 * qps, seconds / 3.0),
                (0.7 * qps, seconds / 3.0),
            ],
        }
    }

    /// Whether second `t` of the cell (from its first arrival) is in a high phase
    /// (a burst, or the step's top).
    pub fn high(self, t: f64, warmup: f64, seconds: f64) -> bool {
        match self {
            Arrival::Steady => false,
            Arrival::Burst => t % BURST_EVERY >= BURST_EVERY - BURST_LEN,
            Arrival::Step => t >= warmup + seconds / 3.0 && t < warmup + 2.0 * seconds / 3.0,
        }
    }
}

/// A burst comes every this many seconds …
const BURST_EVERY: f64 = 20.0;
/// … and lasts this long.
const BURST_LEN: f64 = 4.0;

/// Relative cost of a relaxed request against an interactive one (about 3× the prompt
/// and 2× the output): the QPS of a cell is scaled so every share loads the pool alike.
const RELAXED_COST: f64 = 2.2;

/// The matrix's options.
#[derive(Debug, Clone)]
pub struct Options {
    /// Pool shapes.
    pub pools: Vec<Pool>,
    /// Arrival shapes.
    pub arrivals: Vec<Arrival>,
    /// Interactive shares.
    pub shares: Vec<f64>,
    /// Seeds.
    pub seeds: Vec<u64>,
    /// Mean QPS per 1× server at an even mix.
    pub load: f64,
    /// Every run's figures as JSON.
    pub json: Option<std::path::PathBuf>,
    /// Print where each class's misses went (one run at a time).
    pub trace: bool,
    /// Runs at a time.
    pub jobs: usize,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            pools: Vec::new(),
            arrivals: vec![Arrival::Steady, Arrival::Burst, Arrival::Step],
            shares: vec![0.2, 0.5, 0.8],
            seeds: vec![1, 2],
            load: 1.1,
            json: None,
            trace: false,
            jobs: 2,
        }
    }
}

/// Parses `N:R:J,..`.
pub fn pools(v: &str) -> Option<Vec<Pool>> {
    v.split(',')
        .map(|p| {
            let mut it = p.trim().split(':');
            let servers: usize = it.next()?.parse().ok()?;
            let ratio: f64 = it.next()?.parse().ok()?;
            let jitter: f64 = it.next()?.parse().ok()?;
            (it.next().is_none() && servers > 0 && ratio >= 1.0 && (0.0..=0.5).contains(&jitter))
                .then_some(Pool {
                    servers,
                    ratio,
                    jitter,
                })
        })
        .collect()
}

/// Parses `steady,burst,step`.
pub fn arrivals(v: &str) -> Option<Vec<Arrival>> {
    v.split(',')
        .map(|a| match a.trim() {
            "steady" => Some(Arrival::Steady),
            "burst" => Some(Arrival::Burst),
            "step" => Some(Arrival::Step),
            _ => None,
        })
        .collect()
}

/// One side's result in one cell: per class (interactive, relaxed) requests sent in the
/// window and those that met both SLOs.
#[derive(Debug, Clone, Copy, Default)]
struct Side {
    sent: [usize; 2],
    met: [usize; 2],
}

impl Side {
    fn goodput(&self, seconds: f64) -> f64 {
        (self.met[0] + self.met[1]) as f64 / seconds
    }

    /// Attainment of class `c` (`None` without requests of it).
    fn attainment(&self, c: usize) -> Option<f64> {
        let sent = *self.sent.get(c)?;
        let met = *self.met.get(c)?;
        (sent > 0).then(|| met as f64 / sent as f64)
    }
}

/// The cell's QPS: `load` per 1× server at an even mix, scaled by the pool's speeds and
/// by the share's mean request cost.
fn qps(m: &Options, pool: &Pool, share: f64) -> f64 {
    let capacity: f64 = pool.speeds().iter().map(|f| 1.0 / f).sum();
    let even = 0.5 + 0.5 * RELAXED_COST;
    let cost = share + (1.0 - share) * RELAXED_COST;
    m.load * capacity * even / cost
}

/// Runs `side` on the cell's world; with `trace`, prints where each class's misses went.
fn run_side(
    a: &Args,
    side: &str,
    steps: &[(f64, f64)],
    arrival: Arrival,
    tracing: bool,
) -> anyhow::Result<Side> {
    let (mut sim, eps) = world(a, side)?;
    let start: Nanos = 10 * MS;
    let measure_from = start + (a.warmup * SEC as f64) as Nanos;
    let end = measure_from + (a.seconds * SEC as f64) as Nanos;
    sim.add_requests(requests(a, start, steps, |t| {
        (if t >= measure_from { "m" } else { "w" }).to_string()
    }));
    let mut recorder = tracing.then(trace::Recorder::default);
    match recorder.as_mut() {
        Some(r) => r.run_until(&mut sim, end)?,
        None => sim.run_until(end)?,
    }
    let answered = sim.run_until_answered(end + 900 * SEC)?;
    anyhow::ensure!(answered, "{side}: unanswered 900 s after the last arrival");
    let mut out = Side::default();
    for (c, class) in CLASSES.iter().take(2).enumerate() {
        let label = format!("m{c}");
        for o in sim.outcomes().iter().filter(|o| o.label == label) {
            out.sent[c] += 1;
            if observed(o).is_some_and(|(t, p)| t <= class.ttft && p <= class.tpot) {
                out.met[c] += 1;
            }
        }
    }
    if let Some(r) = recorder {
        let high = |t: Nanos| {
            arrival.high(
                t.saturating_sub(start) as f64 / SEC as f64,
                a.warmup,
                a.seconds,
            )
        };
        r.report(side, &sim, &eps, &a.speeds, measure_from, &high);
    }
    Ok(out)
}

/// One (pool, arrival, share) over the seeds.
struct Row {
    pool: Pool,
    arrival: Arrival,
    share: f64,
    qps: f64,
    /// Per seed: (default, shipped).
    runs: Vec<(Side, Side)>,
}

fn mean(v: impl Iterator<Item = f64>) -> f64 {
    let (s, n) = v.fold((0.0, 0usize), |(s, n), x| (s + x, n + 1));
    if n == 0 {
        f64::NAN
    } else {
        s / n as f64
    }
}

impl Row {
    fn ratios(&self, seconds: f64) -> Vec<f64> {
        self.runs
            .iter()
            .map(|(d, s)| s.goodput(seconds) / d.goodput(seconds).max(1e-9))
            .collect()
    }

    fn attainment(&self, side: usize, c: usize) -> f64 {
        mean(self.runs.iter().filter_map(|r| {
            if side == 0 {
                r.0.attainment(c)
            } else {
                r.1.attainment(c)
            }
        }))
    }

    /// The table row and the goals it misses.
    fn line(&self, seconds: f64) -> (String, Vec<&'static str>) {
        let r = self.ratios(seconds);
        let m = mean(r.iter().copied());
        let lo = r.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = r.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let dg = mean(self.runs.iter().map(|x| x.0.goodput(seconds)));
        let sg = mean(self.runs.iter().map(|x| x.1.goodput(seconds)));
        let sent = mean(
            self.runs
                .iter()
                .map(|x| (x.0.sent[0] + x.0.sent[1]) as f64 / seconds),
        );
        let (di, si) = (self.attainment(0, 0), self.attainment(1, 0));
        let (dr, sr) = (self.attainment(0, 1), self.attainment(1, 1));
        let mut missed = Vec::new();
        if m < 1.0 - (hi - lo) / 2.0 {
            missed.push("G1");
        }
        if di <= 0.85 && m < 1.15 {
            missed.push("G2");
        }
        let (gain_i, gain_r) = (100.0 * (si - di).max(-1.0), 100.0 * (sr - dr).max(-1.0));
        let loses = |own: f64, other: f64| {
            own.is_finite() && own < -5.0 && (other.is_nan() || other <= -own)
        };
        if loses(gain_i, gain_r) || loses(gain_r, gain_i) {
            missed.push("G3");
        }
        let pct = |v: f64| {
            if v.is_finite() {
                format!("{:.0}", 100.0 * v)
            } else {
                "–".into()
            }
        };
        let line = format!(
            "| {} | {} | {:.0} % | {:.1} | {:.2} | {:.2} | **{:.2}** ({:.2}–{:.2}) | {:.2} | {} → {} | {} → {} | {} |",
            self.pool.name(),
            self.arrival.name(),
            100.0 * self.share,
            self.qps,
            dg,
            sg,
            m,
            lo,
            hi,
            sent / dg.max(1e-9),
            pct(di),
            pct(si),
            pct(dr),
            pct(sr),
            if missed.is_empty() {
                "met".to_string()
            } else {
                missed.join(", ")
            }
        );
        (line, missed)
    }

    fn json(&self, seconds: f64) -> Value {
        let side = |s: &Side| json!({"sent": s.sent, "met": s.met, "goodput": s.goodput(seconds)});
        json!({
            "servers": self.pool.servers, "ratio": self.pool.ratio, "jitter": self.pool.jitter,
            "arrival": self.arrival.name(), "share": self.share, "qps": self.qps,
            "default_interactive": self.attainment(0, 0),
            "ratios": self.ratios(seconds),
            "runs": self.runs.iter().map(|(d, s)| json!({"default": side(d), "slo": side(s)})).collect::<Vec<_>>(),
        })
    }
}

/// Runs the matrix and prints its table.
pub fn run(a: &Args, m: &Options) -> anyhow::Result<()> {
    println!(
        "Matrix: vllm-sim h100-llama-8b servers (max-num-seqs {}, {} KV blocks of 16 tokens), {} Envoy workers; \
         two classes: interactive (TTFT 300 ms / TPOT 40 ms, objective critical) and relaxed (3 s / 150 ms, standard); \
         per cell the filter's default profile and `{}` on the same seeded Poisson load of {} × the pool's speed-weighted \
         size (QPS per 1× server at an even mix), warm-up {} s, measured {} s; seeds {:?}",
        a.max_num_seqs,
        a.kv_blocks,
        a.workers,
        a.slo_config.display(),
        m.load,
        a.warmup,
        a.seconds,
        m.seeds
    );
    println!();
    println!("| pool (servers × speeds, jitter) | arrivals | interactive share | QPS | default goodput /s | SLO goodput /s | SLO ÷ default (seeds' min–max) | ceiling | interactive attainment % default → SLO | relaxed | goals |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    // Every (row, seed) run, on `--jobs` threads (each builds its own worlds).
    let mut rows: Vec<Row> = Vec::new();
    let mut runs: Vec<Run> = Vec::new();
    for pool in &m.pools {
        for &arrival in &m.arrivals {
            for &share in &m.shares {
                let q = qps(m, pool, share);
                for &seed in &m.seeds {
                    let mut c = a.clone();
                    c.servers = pool.servers;
                    c.speeds = pool.speeds();
                    c.jitter = Some(pool.jitter);
                    c.seed = seed;
                    c.mix = [share, 1.0 - share, 0.0];
                    let steps = arrival.steps(q, c.warmup, c.seconds);
                    runs.push((rows.len(), c, steps, arrival));
                }
                rows.push(Row {
                    pool: *pool,
                    arrival,
                    share,
                    qps: q,
                    runs: Vec::new(),
                });
            }
        }
    }
    let jobs = if m.trace { 1 } else { m.jobs.max(1) };
    let next = std::sync::atomic::AtomicUsize::new(0);
    let results: std::sync::Mutex<Vec<(usize, u64, Side, Side)>> =
        std::sync::Mutex::new(Vec::new());
    let failure: std::sync::Mutex<Option<anyhow::Error>> = std::sync::Mutex::new(None);
    std::thread::scope(|scope| {
        for _ in 0..jobs {
            scope.spawn(|| loop {
                let k = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some((row, c, steps, arrival)) = runs.get(k) else {
                    return;
                };
                let wall = Instant::now();
                if m.trace {
                    println!(
                        "\ntrace: {} servers, {} arrivals, {:.0} % interactive, seed {}",
                        c.servers,
                        arrival.name(),
                        100.0 * c.mix[0],
                        c.seed
                    );
                }
                let run = run_side(c, "default", steps, *arrival, m.trace)
                    .and_then(|d| Ok((d, run_side(c, "shipped", steps, *arrival, m.trace)?)));
                match run {
                    Ok((d, s)) => {
                        eprintln!(
                            "slo-sim: run {} of {}: {:.2} vs {:.2} /s ({:.1} s)",
                            k + 1,
                            runs.len(),
                            d.goodput(c.seconds),
                            s.goodput(c.seconds),
                            wall.elapsed().as_secs_f64()
                        );
                        if let Ok(mut r) = results.lock() {
                            r.push((*row, c.seed, d, s));
                        }
                    }
                    Err(e) => {
                        if let Ok(mut f) = failure.lock() {
                            *f = Some(e);
                        }
                        next.store(runs.len(), std::sync::atomic::Ordering::Relaxed);
                        return;
                    }
                }
            });
        }
    });
    if let Some(e) = failure.into_inner().ok().flatten() {
        return Err(e);
    }
    let mut results = results.into_inner().unwrap_or_default();
    results.sort_by_key(|r| (r.0, r.1));
    for (row, _, d, s) in results {
        if let Some(r) = rows.get_mut(row) {
            r.runs.push((d, s));
        }
    }
    let mut missed_cells = 0usize;
    for row in &rows {
        let (line, missed) = row.line(a.seconds);
        println!("{line}");
        missed_cells += usize::from(!missed.is_empty());
    }
    println!();
    println!(
        "Cells missing a goal: {missed_cells} of {} (G1: not below the default beyond the seeds' spread; \
         G2: ≥ 1.15× where the default's interactive attainment ≤ 85 %; G3: no class −5 points unless the other gains more). \
         Ceiling = requests sent per second ÷ the default's goodput: the most any router could gain.",
        rows.len()
    );
    if let Some(path) = &m.json {
        let v = json!({
            "load": m.load, "warmup": a.warmup, "seconds": a.seconds, "seeds": m.seeds,
            "rows": rows.iter().map(|r| r.json(a.seconds)).collect::<Vec<_>>(),
        });
        std::fs::write(path, serde_json::to_string_pretty(&v)?)?;
    }
    Ok(())
}
