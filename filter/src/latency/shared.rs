//! The predictor across workers. Every VM buffers the samples of the requests it served
//! and appends them, in one CAS per tick, to a bounded shared queue ([`SAMPLES_KEY`]).
//! One VM — the scrape-lease holder — takes up to [`MAX_TRAIN_PER_TICK`] samples per
//! tick, trains the model, and publishes it ([`MODEL_KEY`], then the small
//! [`VERSION_KEY`]); every VM re-reads the model when the version changes
//! ([`Cache`]). The model lives in shared data, so a crashed or replaced VM loses
//! nothing the next trainer needs: it continues from the published state.
//!
//! Worst case per tick for the trainer: one CAS on the queue, one model read, 256
//! samples × 2 RLS steps (about 200 multiply-adds each) and one model write — tens of
//! microseconds natively, well under a millisecond in V8.

use super::model::{Model, Sample};
use super::predictor::Predictor;
use crate::shared_store::{read, update, SharedStore, StoreError};
use prost::Message;
use std::rc::Rc;

/// Shared-data key of the pending samples.
pub const SAMPLES_KEY: &str = "epp.v1.latency.samples";
/// Shared-data key of the published model.
pub const MODEL_KEY: &str = "epp.v1.latency.model";
/// Shared-data key of the model's publication counter.
pub const VERSION_KEY: &str = "epp.v1.latency.version";
/// Pending samples kept at most (the oldest are dropped: the trainer is behind).
pub const MAX_PENDING: usize = 2_048;
/// Samples trained per tick at most.
pub const MAX_TRAIN_PER_TICK: usize = 256;
/// Samples a VM buffers locally at most between two flushes.
pub const MAX_LOCAL: usize = 1_024;

/// The pending samples.
#[derive(Clone, PartialEq, Message)]
pub struct Pending {
    /// Oldest first.
    #[prost(message, repeated, tag = "1")]
    pub samples: Vec<Sample>,
    /// Samples dropped because the queue was full.
    #[prost(uint64, tag = "2")]
    pub dropped: u64,
}

/// The model's publication counter.
#[derive(Clone, PartialEq, Message)]
pub struct Version {
    /// Bumped at each publication.
    #[prost(uint64, tag = "1")]
    pub n: u64,
}

/// Appends `samples` to the shared queue (one CAS).
pub fn push(store: &impl SharedStore, samples: &[Sample]) -> Result<(), StoreError> {
    if samples.is_empty() {
        return Ok(());
    }
    update(store, SAMPLES_KEY, |p: &mut Pending| {
        p.samples.extend_from_slice(samples);
        let excess = p.samples.len().saturating_sub(MAX_PENDING);
        if excess > 0 {
            p.samples.drain(..excess);
            p.dropped += excess as u64;
        }
    })
}

/// What one training tick did.
#[derive(Debug, Clone, PartialEq)]
pub struct Trained {
    /// Samples trained on this tick.
    pub samples: usize,
    /// The model after it.
    pub model: Model,
}

/// Takes up to [`MAX_TRAIN_PER_TICK`] pending samples, trains the published model on
/// them and publishes it. `None` when nothing was pending.
pub fn train_tick(
    store: &impl SharedStore,
    now_ms: i64,
    tau: f64,
) -> Result<Option<Trained>, StoreError> {
    let batch = update(store, SAMPLES_KEY, |p: &mut Pending| {
        let n = p.samples.len().min(MAX_TRAIN_PER_TICK);
        p.samples.drain(..n).collect::<Vec<_>>()
    })?;
    if batch.is_empty() {
        return Ok(None);
    }
    let model = update(store, MODEL_KEY, |m: &mut Model| {
        if m.tau != tau {
            m.tau = tau;
        }
        for s in &batch {
            m.train(s, now_ms);
        }
        m.expire(now_ms);
        m.clone()
    })?;
    update(store, VERSION_KEY, |v: &mut Version| v.n += 1)?;
    Ok(Some(Trained {
        samples: batch.len(),
        model,
    }))
}

/// A VM's copy of the published model, re-read (and prepared for picks) when the
/// version changes.
#[derive(Debug, Default)]
pub struct Cache {
    version: u64,
    model: Option<Rc<Predictor>>,
}

impl Cache {
    /// The current model (reads the small version key; the model only when it changed).
    pub fn refresh(&mut self, store: &impl SharedStore) -> Option<Rc<Predictor>> {
        match read::<Version>(store, VERSION_KEY) {
            Ok(Some(v)) if v.n != self.version || self.model.is_none() => {
                match read::<Model>(store, MODEL_KEY) {
                    Ok(Some(m)) => {
                        self.version = v.n;
                        self.model = Some(Rc::new(Predictor::new(m)));
                    }
                    Ok(None) => {}
                    Err(e) => log::debug!("latency model unreadable: {e:?}"),
                }
            }
            Ok(_) => {}
            Err(e) => log::debug!("latency model version unreadable: {e:?}"),
        }
        self.model.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::latency::features::N;
    use crate::latency::model::{Objective, Target, MIN_SAMPLES};
    use crate::shared_store::MemoryStore;
    use wasm_bindgen_test::wasm_bindgen_test;

    fn sample(i: usize) -> Sample {
        let load = (i % 10) as f64;
        let mut x = vec![0.0; N];
        x[0] = 1.0;
        x[3] = load;
        Sample {
            address: "a".into(),
            x,
            ttft_ms: 50.0 + 20.0 * load,
            tpot_ms: 10.0 + load,
            ..Sample::default()
        }
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn samples_from_any_worker_train_the_model_every_worker_reads() {
        let store = MemoryStore::default();
        let mut reader = Cache::default();
        assert!(reader.refresh(&store).is_none());
        // Two workers push; the trainer takes at most a tick's worth at a time.
        let a: Vec<Sample> = (0..200).map(sample).collect();
        let b: Vec<Sample> = (200..400).map(sample).collect();
        push(&store, &a).unwrap();
        push(&store, &b).unwrap();
        let first = train_tick(&store, 1, 0.9).unwrap().unwrap();
        assert_eq!(first.samples, MAX_TRAIN_PER_TICK);
        let second = train_tick(&store, 2, 0.9).unwrap().unwrap();
        assert_eq!(second.samples, 400 - MAX_TRAIN_PER_TICK);
        assert_eq!(train_tick(&store, 3, 0.9).unwrap(), None);
        let refreshed = reader.refresh(&store).unwrap();
        let m = refreshed.model();
        assert_eq!(m.samples(Target::Ttft), 400);
        assert!(m.samples(Target::Ttft) >= MIN_SAMPLES);
        let mut x = [0.0; N];
        x[0] = 1.0;
        x[3] = 5.0;
        let p = m.predict(Target::Ttft, "a", &x, Objective::Mean).unwrap();
        assert!((p - 150.0).abs() < 5.0, "{p}");
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn a_full_queue_drops_the_oldest_and_counts_them() {
        let store = MemoryStore::default();
        let many: Vec<Sample> = (0..MAX_PENDING + 10).map(sample).collect();
        push(&store, &many).unwrap();
        let p: Pending = read(&store, SAMPLES_KEY).unwrap().unwrap();
        assert_eq!(p.samples.len(), MAX_PENDING);
        assert_eq!(p.dropped, 10);
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn a_new_trainer_continues_from_the_published_model() {
        let store = MemoryStore::default();
        push(&store, &(0..100).map(sample).collect::<Vec<_>>()).unwrap();
        train_tick(&store, 1, 0.9).unwrap();
        // The trainer's VM dies; another takes over with nothing in memory.
        push(&store, &(0..100).map(sample).collect::<Vec<_>>()).unwrap();
        let t = train_tick(&store, 2, 0.9).unwrap().unwrap();
        assert_eq!(t.model.samples(Target::Ttft), 200);
    }
}
