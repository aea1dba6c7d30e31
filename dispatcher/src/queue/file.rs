//! The embedded queue: an OpenAI Batch input file (`{"custom_id", "method", "url",
//! "body"}` per line) in, an OpenAI Batch output file out (`custom_id`,
//! `response.status_code`, `response.body`, `error`).
//!
//! The output file is the only state. Each result is one `write` of one whole line in
//! append mode, so a kill leaves at most a partial last line, which the next start cuts
//! off. On start every `custom_id` already in the output is skipped, so a restart
//! neither loses nor repeats a result; a request in flight at the kill has no line and
//! is sent again (at-least-once to the gateway, exactly once in the output). The file is
//! not fsync'ed per line: a killed process loses nothing (its writes are in the kernel),
//! a power cut may lose the last lines, which are then sent again.

use super::{Backlog, Queue};
use crate::gate::BoxFuture;
use crate::message::{batch_output, BatchLine, Job, Outcome};
use std::collections::{HashSet, VecDeque};
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

pub struct FileQueue {
    lines: Vec<BatchLine>,
    pending: VecDeque<usize>,
    retries: Vec<(Instant, Job)>,
    out: File,
    answered_before: u64,
    answered: u64,
    fairness_id: Option<String>,
}

impl FileQueue {
    /// Reads `input` whole, resumes from `output` (created if absent).
    pub fn open(
        input: &Path,
        output: &Path,
        fairness_id: Option<String>,
    ) -> Result<FileQueue, String> {
        let text = std::fs::read_to_string(input)
            .map_err(|e| format!("cannot read {}: {e}", input.display()))?;
        let mut lines = Vec::new();
        let mut ids = HashSet::new();
        for (i, raw) in text.lines().enumerate() {
            if raw.trim().is_empty() {
                continue;
            }
            let where_ = format!("{}:{}", input.display(), i + 1);
            let line: BatchLine = serde_json::from_str(raw)
                .map_err(|e| format!("{where_}: not an OpenAI Batch request line: {e}"))?;
            if line.method != "POST" {
                return Err(format!(
                    "{where_}: method `{}`: only POST is supported",
                    line.method
                ));
            }
            if !line.url.starts_with('/') {
                return Err(format!(
                    "{where_}: url `{}` must be a path such as /v1/chat/completions",
                    line.url
                ));
            }
            if !ids.insert(line.custom_id.clone()) {
                return Err(format!(
                    "{where_}: custom_id `{}` appears twice",
                    line.custom_id
                ));
            }
            lines.push(line);
        }
        let done = resume(output)?;
        let unknown = done.iter().filter(|id| !ids.contains(*id)).count();
        if unknown > 0 {
            return Err(format!(
                "{}: {unknown} result(s) for custom_ids not in {}: is it the output of another input?",
                output.display(),
                input.display()
            ));
        }
        let pending: VecDeque<usize> = (0..lines.len())
            .filter(|&i| !done.contains(&lines[i].custom_id))
            .collect();
        let out = OpenOptions::new()
            .create(true)
            .append(true)
            .open(output)
            .map_err(|e| format!("cannot open {}: {e}", output.display()))?;
        Ok(FileQueue {
            answered_before: done.len() as u64,
            lines,
            pending,
            retries: Vec::new(),
            out,
            answered: 0,
            fairness_id,
        })
    }

    fn job(&self, i: usize) -> Job {
        let l = &self.lines[i];
        Job {
            key: i.to_string(),
            id: l.custom_id.clone(),
            deadline_ms: None,
            path: l.url.clone(),
            body: serde_json::to_vec(&l.body).unwrap_or_default(),
            headers: Vec::new(),
            fairness_id: self.fairness_id.clone(),
            attempts: 0,
            invalid: None,
        }
    }
}

/// The custom_ids already answered in `output`; a partial last line (a kill mid-write)
/// is cut off.
fn resume(output: &Path) -> Result<HashSet<String>, String> {
    let mut done = HashSet::new();
    let Ok(bytes) = std::fs::read(output) else {
        return Ok(done);
    };
    let complete = bytes.iter().rposition(|&b| b == b'\n').map_or(0, |p| p + 1);
    if complete < bytes.len() {
        let f = OpenOptions::new()
            .write(true)
            .open(output)
            .map_err(|e| format!("cannot open {}: {e}", output.display()))?;
        f.set_len(complete as u64).map_err(|e| {
            format!(
                "cannot cut the partial last line of {}: {e}",
                output.display()
            )
        })?;
    }
    for (i, line) in String::from_utf8_lossy(&bytes[..complete])
        .lines()
        .enumerate()
    {
        if line.trim().is_empty() {
            continue;
        }
        let v: serde_json::Value = serde_json::from_str(line)
            .map_err(|e| format!("{}:{}: not a result line: {e}", output.display(), i + 1))?;
        let id = v["custom_id"]
            .as_str()
            .ok_or_else(|| format!("{}:{}: no custom_id", output.display(), i + 1))?;
        done.insert(id.to_string());
    }
    Ok(done)
}

impl Queue for FileQueue {
    fn take(&mut self, n: usize) -> BoxFuture<'_, Result<Vec<Job>, String>> {
        let now = Instant::now();
        let mut out = Vec::new();
        let mut i = 0;
        while i < self.retries.len() && out.len() < n {
            if self.retries[i].0 <= now {
                out.push(self.retries.swap_remove(i).1);
            } else {
                i += 1;
            }
        }
        while out.len() < n {
            let Some(i) = self.pending.pop_front() else {
                break;
            };
            out.push(self.job(i));
        }
        Box::pin(async move { Ok(out) })
    }

    fn finish(&mut self, job: Job, outcome: Outcome) -> BoxFuture<'_, Result<bool, String>> {
        let seq = job.key.parse::<u64>().unwrap_or(0);
        let mut line = batch_output(seq, &job.id, &outcome).to_string();
        line.push('\n');
        let r = self
            .out
            .write_all(line.as_bytes())
            .map_err(|e| format!("cannot write a result: {e}"));
        if r.is_ok() {
            self.answered += 1;
        }
        Box::pin(async move { r.map(|()| true) })
    }

    fn retry(&mut self, job: Job, after: Duration) -> BoxFuture<'_, Result<(), String>> {
        self.retries.push((Instant::now() + after, job));
        Box::pin(async { Ok(()) })
    }

    fn release(&mut self, jobs: Vec<Job>) -> BoxFuture<'_, Result<(), String>> {
        for j in jobs.into_iter().rev() {
            if let Ok(i) = j.key.parse::<usize>() {
                self.pending.push_front(i);
            }
        }
        Box::pin(async { Ok(()) })
    }

    fn tick(&mut self) -> BoxFuture<'_, Result<(), String>> {
        Box::pin(async { Ok(()) })
    }

    fn backlog(&mut self) -> BoxFuture<'_, Result<Backlog, String>> {
        let total = self.lines.len() as u64;
        let b = Backlog {
            unanswered: total - self.answered_before - self.answered,
            answered: self.answered_before + self.answered,
            total: Some(total),
        };
        Box::pin(async move { Ok(b) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(id: &str) -> String {
        format!(
            r#"{{"custom_id":"{id}","method":"POST","url":"/v1/completions","body":{{"model":"m","prompt":"p"}}}}"#
        )
    }

    #[tokio::test]
    async fn a_restart_skips_answered_lines_and_cuts_a_partial_one() {
        let dir = std::env::temp_dir().join(format!("dispatcher-file-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (inp, out) = (dir.join("in.jsonl"), dir.join("out.jsonl"));
        std::fs::write(&inp, [line("a"), line("b"), line("c")].join("\n")).unwrap();
        let _ = std::fs::remove_file(&out);
        {
            let mut q = FileQueue::open(&inp, &out, None).unwrap();
            let jobs = q.take(2).await.unwrap();
            assert_eq!(jobs.len(), 2);
            let a = jobs[0].clone();
            q.finish(
                a,
                Outcome::Http {
                    status: 200,
                    body: "{}".into(),
                },
            )
            .await
            .unwrap();
        }
        // A kill in the middle of the next line.
        let mut f = OpenOptions::new().append(true).open(&out).unwrap();
        f.write_all(br#"{"custom_id":"b","respo"#).unwrap();
        let mut q = FileQueue::open(&inp, &out, None).unwrap();
        let ids: Vec<String> = q
            .take(10)
            .await
            .unwrap()
            .into_iter()
            .map(|j| j.id)
            .collect();
        assert_eq!(ids, ["b", "c"]);
        assert_eq!(q.backlog().await.unwrap().answered, 1);
        let text = std::fs::read_to_string(&out).unwrap();
        assert_eq!(text.lines().count(), 1, "{text}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_bad_input_line_is_named() {
        let dir = std::env::temp_dir().join(format!("dispatcher-file-bad-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let inp = dir.join("in.jsonl");
        std::fs::write(&inp, format!("{}\n{}\n", line("a"), line("a"))).unwrap();
        let e = FileQueue::open(&inp, &dir.join("o.jsonl"), None)
            .err()
            .unwrap();
        assert!(e.contains("in.jsonl:2") && e.contains("twice"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
