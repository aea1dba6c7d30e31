//! llm-d-async's `redis-sortedset` transport, so either processor can serve the other's
//! producers: requests wait in a sorted set scored by deadline (Unix seconds; default
//! key `request-sortedset`), retries in `retry-sortedset` scored by due time, results
//! are `LPUSH`ed to `result-list` (or the message's `result_queue_name`).
//!
//! Where llm-d-async pops with `ZPOPMIN` (a crash between pop and result loses the
//! request), this processor **leases**: one Lua script pops and records the member in a
//! lease set (`dispatcher:leases:<queue>`, scored by lease expiry, with the original
//! score kept in `dispatcher:lease-scores:<queue>`). Leases of requests in flight are
//! renewed every third of the lease time; any processor puts an expired lease back in
//! the queue with its deadline. So several processors share one Redis, and a processor
//! killed at any point loses nothing: its requests return to the queue when their leases
//! expire (**at-least-once** dispatch).
//!
//! A request is **answered once**: the result is written by a script that first sets
//! `dispatcher:answered:<id>:<request_token>` with `SET NX` (with a TTL) and pushes the
//! result only if it was the one to set it, then drops the member from the lease set,
//! the queue and the retry set. A request dispatched twice (its first processor died
//! after dispatch, or stalled past its lease) still yields one result.

use super::{Backlog, Queue};
use crate::gate::BoxFuture;
use crate::message::{async_result, Job, Member, Outcome};
use redis::aio::ConnectionManager;
use redis::Script;
use std::collections::HashSet;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Key names and timings.
#[derive(Debug, Clone)]
pub struct Keys {
    pub queue: String,
    pub retry: String,
    pub results: String,
    /// Default request path (llm-d-async `request_path_url`), when a message has no `endpoint`.
    pub request_path: String,
    pub lease: Duration,
    /// How long the answered markers live (and so how long a repeat is recognised).
    pub answered_ttl: Duration,
}

impl Keys {
    fn leases(&self) -> String {
        format!("dispatcher:leases:{}", self.queue)
    }
    fn lease_scores(&self) -> String {
        format!("dispatcher:lease-scores:{}", self.queue)
    }
}

const TAKE: &str = r"
local popped = redis.call('ZPOPMIN', KEYS[1], ARGV[1])
local out = {}
for i = 1, #popped, 2 do
  redis.call('ZADD', KEYS[2], ARGV[2], popped[i])
  redis.call('HSET', KEYS[3], popped[i], popped[i + 1])
  table.insert(out, popped[i])
end
return out
";

const FINISH: &str = r"
local first = redis.call('SET', KEYS[4], '1', 'NX', 'EX', ARGV[3])
if first then redis.call('LPUSH', KEYS[3], ARGV[2]) end
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
redis.call('ZREM', KEYS[6], ARGV[1])
redis.call('ZREM', KEYS[7], ARGV[1])
if ARGV[4] ~= '' and redis.call('GET', KEYS[5]) == ARGV[4] then redis.call('DEL', KEYS[5]) end
if first then return 1 else return 0 end
";

const RETRY: &str = r"
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
redis.call('ZADD', KEYS[3], ARGV[2], ARGV[1])
return 1
";

const RELEASE: &str = r"
if redis.call('ZREM', KEYS[1], ARGV[1]) == 1 then
  local score = redis.call('HGET', KEYS[2], ARGV[1]) or '0'
  redis.call('HDEL', KEYS[2], ARGV[1])
  redis.call('ZADD', KEYS[3], score, ARGV[1])
end
return 1
";

/// Expired leases back to the queue (original score), due retries back to their queue
/// (scored by deadline, as llm-d-async's retry mover does).
const UPKEEP: &str = r"
local moved = 0
local expired = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, ARGV[3])
for _, m in ipairs(expired) do
  local score = redis.call('HGET', KEYS[2], m) or '0'
  redis.call('ZREM', KEYS[1], m)
  redis.call('HDEL', KEYS[2], m)
  redis.call('ZADD', KEYS[3], score, m)
  moved = moved + 1
end
local due = redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', ARGV[2], 'LIMIT', 0, ARGV[3])
for _, m in ipairs(due) do
  if redis.call('ZREM', KEYS[4], m) == 1 then
    local queue, deadline = KEYS[3], 0
    local ok, v = pcall(cjson.decode, m)
    if ok and type(v) == 'table' then
      local data = v
      if v['request_kind'] ~= nil and type(v['data']) == 'table' then data = v['data'] end
      if type(data['deadline']) == 'number' then deadline = data['deadline'] end
      if type(v['internal']) == 'table' and type(v['internal']['request_queue_name']) == 'string'
         and v['internal']['request_queue_name'] ~= '' then
        queue = v['internal']['request_queue_name']
      end
    end
    redis.call('ZADD', queue, deadline, m)
    moved = moved + 1
  end
end
return moved
";

/// How often expired leases and due retries are moved back to the queue.
const UPKEEP_EVERY: Duration = Duration::from_millis(250);

pub struct RedisQueue {
    conn: ConnectionManager,
    keys: Keys,
    fairness_attribute: String,
    /// Members leased by this process and not yet finished/retried/released.
    leased: HashSet<String>,
    last_renew: Instant,
    last_upkeep: Instant,
    answered: u64,
    scripts: Scripts,
}

struct Scripts {
    take: Script,
    finish: Script,
    retry: Script,
    release: Script,
    upkeep: Script,
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

impl RedisQueue {
    /// Connects to `url` (`redis://host:port/db`).
    pub async fn connect(
        url: &str,
        keys: Keys,
        fairness_attribute: String,
    ) -> Result<RedisQueue, String> {
        let client = redis::Client::open(url).map_err(|e| format!("redis url `{url}`: {e}"))?;
        let conn = ConnectionManager::new(client)
            .await
            .map_err(|e| format!("cannot connect to {url}: {e}"))?;
        Ok(RedisQueue {
            conn,
            keys,
            fairness_attribute,
            leased: HashSet::new(),
            last_renew: Instant::now(),
            last_upkeep: Instant::now() - UPKEEP_EVERY,
            answered: 0,
            scripts: Scripts {
                take: Script::new(TAKE),
                finish: Script::new(FINISH),
                retry: Script::new(RETRY),
                release: Script::new(RELEASE),
                upkeep: Script::new(UPKEEP),
            },
        })
    }

    fn job(&self, raw: String) -> Job {
        match Member::decode(&raw) {
            Ok(m) => {
                let r = &m.request;
                let path = if r.endpoint.is_empty() {
                    self.keys.request_path.clone()
                } else {
                    r.endpoint.clone()
                };
                let (body, invalid) = match &r.payload {
                    v if v.is_object() => (serde_json::to_vec(v).unwrap_or_default(), None),
                    _ => (Vec::new(), Some("payload is not a JSON object".to_string())),
                };
                let invalid = invalid.or_else(|| {
                    (r.deadline <= 0).then(|| format!("invalid deadline {}", r.deadline))
                });
                Job {
                    id: r.id.clone(),
                    deadline_ms: (r.deadline > 0).then(|| r.deadline as u64 * 1000),
                    path,
                    body,
                    headers: r
                        .headers
                        .iter()
                        .map(|(k, v)| (k.clone(), v.clone()))
                        .collect(),
                    fairness_id: r.metadata.get(&self.fairness_attribute).cloned(),
                    attempts: 0,
                    invalid,
                    key: raw,
                }
            }
            Err(e) => {
                // Answerable only if an id can be found.
                let v: serde_json::Value = serde_json::from_str(&raw).unwrap_or_default();
                let id = v["id"]
                    .as_str()
                    .or(v["data"]["id"].as_str())
                    .unwrap_or_default();
                Job {
                    id: id.to_string(),
                    deadline_ms: None,
                    path: String::new(),
                    body: Vec::new(),
                    headers: Vec::new(),
                    fairness_id: None,
                    attempts: 0,
                    invalid: Some(e),
                    key: raw,
                }
            }
        }
    }

    fn lease_until(&self) -> u64 {
        now_ms() + self.keys.lease.as_millis() as u64
    }
}

impl Queue for RedisQueue {
    fn take(&mut self, n: usize) -> BoxFuture<'_, Result<Vec<Job>, String>> {
        Box::pin(async move {
            if n == 0 {
                return Ok(Vec::new());
            }
            let members: Vec<String> = self
                .scripts
                .take
                .key(&self.keys.queue)
                .key(self.keys.leases())
                .key(self.keys.lease_scores())
                .arg(n)
                .arg(self.lease_until())
                .invoke_async(&mut self.conn)
                .await
                .map_err(|e| format!("take: {e}"))?;
            let mut jobs = Vec::with_capacity(members.len());
            for m in members {
                self.leased.insert(m.clone());
                jobs.push(self.job(m));
            }
            Ok(jobs)
        })
    }

    fn finish(&mut self, job: Job, outcome: Outcome) -> BoxFuture<'_, Result<bool, String>> {
        Box::pin(async move {
            let (token, result_queue) = match Member::decode(&job.key) {
                Ok(m) => (m.token, m.result_queue),
                Err(_) => (String::new(), String::new()),
            };
            let results = if result_queue.is_empty() {
                self.keys.results.clone()
            } else {
                result_queue
            };
            let answered = format!("dispatcher:answered:{}:{}", job.id, token);
            let result = async_result(&job.id, &outcome).to_string();
            let wrote: i64 = self
                .scripts
                .finish
                .key(self.keys.leases())
                .key(self.keys.lease_scores())
                .key(&results)
                .key(answered)
                .key(format!("request-active:{}", job.id))
                .key(&self.keys.queue)
                .key(&self.keys.retry)
                .arg(&job.key)
                .arg(result)
                .arg(self.keys.answered_ttl.as_secs().max(1))
                .arg(token)
                .invoke_async(&mut self.conn)
                .await
                .map_err(|e| format!("finish {}: {e}", job.id))?;
            self.leased.remove(&job.key);
            if wrote == 1 {
                self.answered += 1;
            }
            Ok(wrote == 1)
        })
    }

    fn retry(&mut self, job: Job, after: Duration) -> BoxFuture<'_, Result<(), String>> {
        Box::pin(async move {
            let due_s = (now_ms() + after.as_millis() as u64).div_ceil(1000);
            let _: i64 = self
                .scripts
                .retry
                .key(self.keys.leases())
                .key(self.keys.lease_scores())
                .key(&self.keys.retry)
                .arg(&job.key)
                .arg(due_s)
                .invoke_async(&mut self.conn)
                .await
                .map_err(|e| format!("retry {}: {e}", job.id))?;
            self.leased.remove(&job.key);
            Ok(())
        })
    }

    fn release(&mut self, jobs: Vec<Job>) -> BoxFuture<'_, Result<(), String>> {
        Box::pin(async move {
            for job in jobs {
                let _: i64 = self
                    .scripts
                    .release
                    .key(self.keys.leases())
                    .key(self.keys.lease_scores())
                    .key(&self.keys.queue)
                    .arg(&job.key)
                    .invoke_async(&mut self.conn)
                    .await
                    .map_err(|e| format!("release {}: {e}", job.id))?;
                self.leased.remove(&job.key);
            }
            Ok(())
        })
    }

    fn tick(&mut self) -> BoxFuture<'_, Result<(), String>> {
        Box::pin(async move {
            if self.last_renew.elapsed() >= self.keys.lease / 3 && !self.leased.is_empty() {
                self.last_renew = Instant::now();
                let until = self.lease_until();
                let mut pipe = redis::pipe();
                for m in &self.leased {
                    pipe.cmd("ZADD")
                        .arg(self.keys.leases())
                        .arg("XX")
                        .arg(until)
                        .arg(m)
                        .ignore();
                }
                let _: () = pipe
                    .query_async(&mut self.conn)
                    .await
                    .map_err(|e| format!("renew leases: {e}"))?;
            }
            if self.last_upkeep.elapsed() < UPKEEP_EVERY {
                return Ok(());
            }
            self.last_upkeep = Instant::now();
            let _: i64 = self
                .scripts
                .upkeep
                .key(self.keys.leases())
                .key(self.keys.lease_scores())
                .key(&self.keys.queue)
                .key(&self.keys.retry)
                .arg(now_ms())
                .arg(now_ms() / 1000)
                .arg(100)
                .invoke_async(&mut self.conn)
                .await
                .map_err(|e| format!("upkeep: {e}"))?;
            Ok(())
        })
    }

    fn backlog(&mut self) -> BoxFuture<'_, Result<Backlog, String>> {
        Box::pin(async move {
            let (q, r, l): (u64, u64, u64) = redis::pipe()
                .zcard(&self.keys.queue)
                .zcard(&self.keys.retry)
                .zcard(self.keys.leases())
                .query_async(&mut self.conn)
                .await
                .map_err(|e| format!("backlog: {e}"))?;
            Ok(Backlog {
                unanswered: q + r + l,
                answered: self.answered,
                total: None,
            })
        })
    }
}
