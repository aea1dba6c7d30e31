//! What is sent and when: the shared-prefix prompt groups of inference-perf / sglang
//! `generated-shared-prefix` (groups x prompts per group, a system prompt shared by a
//! group, a question per prompt), tenants, priorities, and seeded Poisson arrivals.
//!
//! Everything is a function of the seed: the same seed gives the same prompts, the same
//! request sequence and the same arrival times.
//!
//! Lengths are in tokens of `vllm-sim`'s tokenizer, which cuts text into 4-character
//! pieces: a token here is one 4-character word (`"abc "`), so a system prompt of N
//! tokens is 4N characters and the question starts on a token boundary.

use serde_json::{json, Value};
use std::time::Duration;
use vllm_sim::rng::Rng;

/// The load generator's seeded generator: `vllm-sim`'s SplitMix64, started from the
/// seed XORed with a constant of the load generator's own (a seed gives the workload it
/// always gave).
fn seeded(seed: u64) -> Rng {
    Rng::new(seed ^ 0x5851_f42d_4c95_7f2d)
}

/// Which OpenAI API the requests use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    Completions,
    Chat,
}

impl Api {
    pub fn path(self) -> &'static str {
        match self {
            Api::Completions => "/v1/completions",
            Api::Chat => "/v1/chat/completions",
        }
    }
}

/// The shape of the requests.
#[derive(Debug, Clone)]
pub struct Spec {
    pub api: Api,
    pub model: String,
    pub groups: u32,
    pub prompts_per_group: u32,
    pub system_prompt_len: u32,
    pub question_len: u32,
    /// With a value above `question_len`: each question's length is drawn uniformly
    /// from `question_len..=question_len_max` (0 = every question `question_len` long).
    pub question_len_max: u32,
    pub output_len: u32,
    /// With a value above `output_len`: each request's `max_tokens` is drawn uniformly
    /// from `output_len..=output_len_max` (0 = always `output_len`).
    pub output_len_max: u32,
    pub stream: bool,
    /// Zipf exponent over groups (0 = uniform): group k is drawn with weight 1/(k+1)^s.
    pub zipf: f64,
    /// Fairness ids `tenant-0..tenants-1` (0 = no header).
    pub tenants: u32,
    /// Every this many requests the tenant ids move on by one (`tenant-E..E+tenants-1`
    /// for request index / churn = E), so old tenants go idle and new ones appear
    /// (0 = fixed ids).
    pub tenant_churn: u64,
    /// Fraction of streamed requests the client abandons after the first token.
    pub cancel: f64,
    /// Objective names for `x-gateway-inference-objective` (empty = no header).
    pub priorities: Vec<String>,
}

impl Default for Spec {
    fn default() -> Spec {
        Spec {
            api: Api::Completions,
            model: "sim-model".into(),
            groups: 8,
            prompts_per_group: 8,
            system_prompt_len: 256,
            question_len: 64,
            question_len_max: 0,
            output_len: 32,
            output_len_max: 0,
            stream: true,
            zipf: 0.0,
            tenants: 0,
            tenant_churn: 0,
            cancel: 0.0,
            priorities: Vec::new(),
        }
    }
}

/// Header naming the fairness id (tenant).
pub const FAIRNESS_HEADER: &str = "x-gateway-inference-fairness-id";
/// Header naming the objective (priority).
pub const OBJECTIVE_HEADER: &str = "x-gateway-inference-objective";

/// One request to send.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    pub index: u64,
    pub group: u32,
    pub prompt: u32,
    pub body: String,
    pub tenant: Option<String>,
    pub objective: Option<String>,
    /// The client closes the connection after the first token.
    pub cancel: bool,
}

/// The prompts and the seeded request sequence.
pub struct Workload {
    spec: Spec,
    systems: Vec<String>,
    /// questions[group][prompt]
    questions: Vec<Vec<String>>,
    /// Cumulative group weights (for the Zipf draw).
    cumulative: Vec<f64>,
    rng: Rng,
}

const LETTERS: &[u8] = b"abcdefghijklmnopqrstuvwxyz";

/// A length from `min..=max` (`min` when `max` is not above it; the generator is
/// drawn only for a range, so fixed lengths keep the sequences they always gave).
fn length(rng: &mut Rng, min: u32, max: u32) -> u32 {
    if max > min {
        min + rng.below(u64::from(max - min) + 1) as u32
    } else {
        min
    }
}

/// `tokens` 4-character words.
fn text(rng: &mut Rng, tokens: u32) -> String {
    let mut s = String::with_capacity(tokens as usize * 4);
    for _ in 0..tokens {
        for _ in 0..3 {
            s.push(LETTERS[rng.below(LETTERS.len() as u64) as usize] as char);
        }
        s.push(' ');
    }
    s
}

impl Workload {
    pub fn new(spec: Spec, seed: u64) -> Workload {
        let mut rng = seeded(seed);
        let groups = spec.groups.max(1);
        let per = spec.prompts_per_group.max(1);
        let systems: Vec<String> = (0..groups)
            .map(|_| text(&mut rng, spec.system_prompt_len))
            .collect();
        let questions = (0..groups)
            .map(|_| {
                (0..per)
                    .map(|_| {
                        let n = length(&mut rng, spec.question_len, spec.question_len_max);
                        text(&mut rng, n)
                    })
                    .collect()
            })
            .collect();
        let mut cumulative = Vec::with_capacity(groups as usize);
        let mut total = 0.0;
        for k in 0..groups {
            total += 1.0 / f64::from(k + 1).powf(spec.zipf.max(0.0));
            cumulative.push(total);
        }
        Workload {
            spec,
            systems,
            questions,
            cumulative,
            rng,
        }
    }

    pub fn spec(&self) -> &Spec {
        &self.spec
    }

    /// The shared system prompt of a group.
    pub fn system_prompt(&self, group: u32) -> &str {
        &self.systems[group as usize]
    }

    fn draw_group(&mut self) -> u32 {
        let total = self.cumulative.last().copied().unwrap_or(1.0);
        let x = self.rng.next_f64() * total;
        self.cumulative
            .partition_point(|&c| c <= x)
            .min(self.cumulative.len() - 1) as u32
    }

    /// The next request of the sequence.
    pub fn next_request(&mut self, index: u64) -> Request {
        let group = self.draw_group();
        let prompt = self
            .rng
            .below(u64::from(self.spec.prompts_per_group.max(1))) as u32;
        let epoch = index.checked_div(self.spec.tenant_churn).unwrap_or(0);
        let tenant = (self.spec.tenants > 0).then(|| {
            format!(
                "tenant-{}",
                epoch + self.rng.below(u64::from(self.spec.tenants))
            )
        });
        // Drawn only when asked for, so runs without it keep their sequence.
        let cancel = self.spec.stream && self.spec.cancel > 0.0 && {
            self.rng.next_f64() < self.spec.cancel
        };
        let objective = (!self.spec.priorities.is_empty()).then(|| {
            let i = self.rng.below(self.spec.priorities.len() as u64) as usize;
            self.spec.priorities[i].clone()
        });
        let max_tokens = length(
            &mut self.rng,
            self.spec.output_len,
            self.spec.output_len_max,
        );
        let system = &self.systems[group as usize];
        let question = &self.questions[group as usize][prompt as usize];
        let s = &self.spec;
        let mut body = match s.api {
            Api::Completions => json!({
                "model": s.model,
                "prompt": format!("{system}{question}"),
            }),
            Api::Chat => json!({
                "model": s.model,
                "messages": [
                    {"role": "system", "content": system},
                    {"role": "user", "content": question},
                ],
            }),
        };
        body["max_tokens"] = json!(max_tokens.max(1));
        body["ignore_eos"] = Value::Bool(true);
        body["stream"] = Value::Bool(s.stream);
        if s.stream {
            body["stream_options"] = json!({"include_usage": true});
        }
        Request {
            index,
            group,
            prompt,
            body: body.to_string(),
            tenant,
            objective,
            cancel,
        }
    }
}

/// Seeded Poisson arrival offsets at `qps` requests per second (from its own seed
/// stream, so arrival times do not depend on the request shapes).
pub struct Arrivals {
    rng: Rng,
    qps: f64,
    at: f64,
}

impl Arrivals {
    pub fn new(qps: f64, seed: u64) -> Arrivals {
        Arrivals {
            rng: seeded(seed.wrapping_add(0x0a11_ce5e_ed00_0001)),
            qps,
            at: 0.0,
        }
    }
}

impl Iterator for Arrivals {
    type Item = Duration;
    fn next(&mut self) -> Option<Duration> {
        self.at += self.rng.exp(self.qps);
        Some(Duration::from_secs_f64(self.at))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> Spec {
        Spec {
            groups: 4,
            prompts_per_group: 3,
            system_prompt_len: 10,
            question_len: 5,
            output_len: 7,
            tenants: 3,
            priorities: vec!["high".into(), "low".into()],
            ..Spec::default()
        }
    }

    fn sequence(seed: u64, n: u64) -> Vec<Request> {
        let mut w = Workload::new(spec(), seed);
        (0..n).map(|i| w.next_request(i)).collect()
    }

    #[test]
    fn the_same_seed_gives_the_same_requests() {
        assert_eq!(sequence(7, 50), sequence(7, 50));
        assert_ne!(sequence(7, 50), sequence(8, 50));
        let a: Vec<Duration> = Arrivals::new(5.0, 7).take(20).collect();
        let b: Vec<Duration> = Arrivals::new(5.0, 7).take(20).collect();
        let c: Vec<Duration> = Arrivals::new(5.0, 8).take(20).collect();
        assert_eq!(a, b);
        assert_ne!(a, c);
    }

    #[test]
    fn prompts_share_their_group_prefix_and_have_the_requested_lengths() {
        let w = Workload::new(spec(), 1);
        for g in 0..4 {
            assert_eq!(w.system_prompt(g).len(), 40, "10 tokens of 4 characters");
        }
        assert_ne!(w.system_prompt(0), w.system_prompt(1));
        let mut w = Workload::new(spec(), 1);
        let mut seen_groups = std::collections::HashSet::new();
        for i in 0..200 {
            let r = w.next_request(i);
            let body: Value = serde_json::from_str(&r.body).unwrap();
            let prompt = body["prompt"].as_str().unwrap();
            assert_eq!(prompt.len(), 60);
            assert!(prompt.starts_with(w.system_prompt(r.group)));
            assert_eq!(body["max_tokens"], 7);
            assert_eq!(body["ignore_eos"], true);
            assert_eq!(body["stream"], true);
            assert_eq!(body["stream_options"]["include_usage"], true);
            assert!(r.prompt < 3);
            let t = r.tenant.unwrap();
            assert!(["tenant-0", "tenant-1", "tenant-2"].contains(&t.as_str()));
            assert!(["high", "low"].contains(&r.objective.unwrap().as_str()));
            seen_groups.insert(r.group);
        }
        assert_eq!(seen_groups.len(), 4, "every group is drawn");
    }

    #[test]
    fn chat_requests_put_the_system_prompt_first() {
        let mut w = Workload::new(
            Spec {
                api: Api::Chat,
                stream: false,
                tenants: 0,
                priorities: vec![],
                ..spec()
            },
            3,
        );
        let r = w.next_request(0);
        let body: Value = serde_json::from_str(&r.body).unwrap();
        assert_eq!(body["messages"][0]["role"], "system");
        assert_eq!(body["messages"][0]["content"], w.system_prompt(r.group));
        assert_eq!(body["messages"][1]["content"].as_str().unwrap().len(), 20);
        assert!(body.get("stream_options").is_none());
        assert!(r.tenant.is_none() && r.objective.is_none());
    }

    #[test]
    fn length_ranges_give_every_length_in_the_range_and_only_those() {
        let mut w = Workload::new(
            Spec {
                prompts_per_group: 50,
                question_len_max: 9,
                output_len_max: 12,
                ..spec()
            },
            2,
        );
        let (mut questions, mut outputs) = (Vec::new(), Vec::new());
        for i in 0..400 {
            let r = w.next_request(i);
            let body: Value = serde_json::from_str(&r.body).unwrap();
            let prompt = body["prompt"].as_str().unwrap();
            questions.push((prompt.len() - 40) / 4);
            outputs.push(body["max_tokens"].as_u64().unwrap());
        }
        for n in 5..=9 {
            assert!(questions.contains(&n), "question length {n} drawn");
        }
        assert!(questions.iter().all(|n| (5..=9).contains(n)));
        for n in 7..=12 {
            assert!(outputs.contains(&n), "max_tokens {n} drawn");
        }
        assert!(outputs.iter().all(|n| (7..=12).contains(n)));
    }

    #[test]
    fn zipf_skews_towards_the_first_groups() {
        let mut w = Workload::new(
            Spec {
                groups: 10,
                zipf: 1.5,
                ..spec()
            },
            5,
        );
        let mut counts = [0u32; 10];
        for i in 0..5000 {
            counts[w.next_request(i).group as usize] += 1;
        }
        // Weights 1, 0.35, 0.19, ..., 0.03 (sum 2.0): group 0 gets about 50 %, group 9 about 1.6 %.
        assert!(counts[0] > 2300 && counts[0] < 2700, "{counts:?}");
        assert!(counts[0] > 3 * counts[2], "{counts:?}");
        assert!(counts[9] < 200, "{counts:?}");
    }

    #[test]
    fn poisson_arrivals_have_the_requested_rate() {
        let qps = 50.0;
        let times: Vec<Duration> = Arrivals::new(qps, 11).take(20_000).collect();
        assert!(times.windows(2).all(|w| w[0] <= w[1]));
        let rate = times.len() as f64 / times.last().unwrap().as_secs_f64();
        assert!((rate - qps).abs() < qps * 0.03, "rate {rate}");
        // Exponential gaps: the coefficient of variation is 1.
        let gaps: Vec<f64> = times
            .windows(2)
            .map(|w| (w[1] - w[0]).as_secs_f64())
            .collect();
        let mean = gaps.iter().sum::<f64>() / gaps.len() as f64;
        let var = gaps.iter().map(|g| (g - mean).powi(2)).sum::<f64>() / gaps.len() as f64;
        let cv = var.sqrt() / mean;
        assert!((cv - 1.0).abs() < 0.05, "cv {cv}");
    }
}
