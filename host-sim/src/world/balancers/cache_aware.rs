//! A model of sglang-router 0.3.2's `cache_aware` policy: a multi-tenant radix tree of
//! the request texts each worker has been sent, keyed on characters (no tokenizer), and a
//! load check that overrides cache affinity when the workers are too unevenly loaded.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap};

use serde_json::Value;

use super::{Balancer, Candidate, Pick};

/// `cache_aware` as sglang-router 0.3.2 runs it for one model.
///
/// Per request: if the in-flight counts are imbalanced (`max - min > abs` and
/// `max > min * rel`) the least-loaded worker wins; otherwise the worker that holds the
/// longest cached prefix of the text wins if that prefix is more than `cache_threshold`
/// of the text, else the least-loaded worker. Either way the text is then inserted into
/// the tree for the chosen worker.
///
/// Simplification: sglang evicts every 60 s, trimming each worker above
/// `max_tree_size` characters by its least recently used leaves; this model trims the
/// worker it has just inserted for, right after the insert.
pub struct CacheAware {
    tree: Tree,
    cache_threshold: f64,
    balance_abs_threshold: u64,
    balance_rel_threshold: f64,
    max_tree_size: usize,
}

impl CacheAware {
    /// sglang-router's defaults: `cache_threshold` 0.3, `balance_abs_threshold` 64,
    /// `balance_rel_threshold` 1.5, `max_tree_size` 2^26 characters.
    pub fn new() -> CacheAware {
        CacheAware {
            tree: Tree::new(),
            cache_threshold: 0.3,
            balance_abs_threshold: 64,
            balance_rel_threshold: 1.5,
            max_tree_size: 1 << 26,
        }
    }

    /// The share of the text a cached prefix must exceed to win the request.
    pub fn cache_threshold(mut self, threshold: f64) -> CacheAware {
        self.cache_threshold = threshold;
        self
    }

    /// The loads are imbalanced when `max - min > abs` and `max > min * rel`.
    pub fn balance_thresholds(mut self, abs: u64, rel: f64) -> CacheAware {
        self.balance_abs_threshold = abs;
        self.balance_rel_threshold = rel;
        self
    }

    /// The most characters the tree keeps for one worker.
    pub fn max_tree_size(mut self, chars: usize) -> CacheAware {
        self.max_tree_size = chars;
        self
    }

    fn imbalanced(&self, candidates: &[Candidate]) -> bool {
        let loads = candidates.iter().map(|c| c.in_flight);
        let (Some(min), Some(max)) = (loads.clone().min(), loads.max()) else {
            return false;
        };
        max - min > self.balance_abs_threshold
            && max as f64 > min as f64 * self.balance_rel_threshold
    }
}

impl Default for CacheAware {
    fn default() -> CacheAware {
        CacheAware::new()
    }
}

impl Balancer for CacheAware {
    fn name(&self) -> &str {
        "sglang cache_aware (model)"
    }

    fn pick(&mut self, req: &Pick<'_>) -> Option<String> {
        let candidates = req.candidates;
        let least = least_loaded(candidates)?;
        let text = routing_text(req.body);
        if text.is_empty() {
            return Some(candidates[least].addr.clone());
        }
        let chosen = if self.imbalanced(candidates) {
            least
        } else {
            // Tenant id -> its index among the candidates (absent tenants: None).
            let mut slot = vec![None; self.tree.tenants.len()];
            for (i, c) in candidates.iter().enumerate() {
                if let Some(&t) = self.tree.tenant_ids.get(&c.addr) {
                    slot[t as usize] = Some(i);
                }
            }
            let total = text.chars().count();
            match self.tree.best_match(&text, &slot) {
                Some((matched, t)) if matched as f64 / total as f64 > self.cache_threshold => {
                    slot[t as usize].unwrap_or(least)
                }
                _ => least,
            }
        };
        let addr = &candidates[chosen].addr;
        let t = self.tree.tenant(addr);
        self.tree.insert(&text, t);
        if self.tree.tenants[t as usize].chars > self.max_tree_size {
            self.tree.evict(t, self.max_tree_size);
        }
        Some(addr.clone())
    }
}

/// The index of the candidate with the fewest requests in flight (the first on ties).
fn least_loaded(candidates: &[Candidate]) -> Option<usize> {
    (0..candidates.len()).min_by_key(|&i| candidates[i].in_flight)
}

/// The text sglang-router routes on: a completion's `prompt` (an array joined with
/// spaces), or a chat's message contents concatenated; empty if there is none.
fn routing_text(body: &[u8]) -> String {
    let Ok(json) = serde_json::from_slice::<Value>(body) else {
        return String::new();
    };
    if let Some(prompt) = json.get("prompt") {
        return match prompt {
            Value::String(s) => s.clone(),
            Value::Array(parts) => parts
                .iter()
                .filter_map(Value::as_str)
                .collect::<Vec<_>>()
                .join(" "),
            _ => String::new(),
        };
    }
    let mut text = String::new();
    let messages = json.get("messages").and_then(Value::as_array);
    for message in messages.into_iter().flatten() {
        match message.get("content") {
            Some(Value::String(s)) => text.push_str(s),
            Some(Value::Array(parts)) => {
                for part in parts {
                    if let Some(s) = part.get("text").and_then(Value::as_str) {
                        text.push_str(s);
                    }
                }
            }
            _ => {}
        }
    }
    text
}

/// The root's index in the arena (its label is empty and it has no owners).
const ROOT: usize = 0;

/// A node of the compressed radix tree.
///
/// Invariant: a tenant that owns a node owns all its ancestors (inserts stamp the whole
/// path, eviction only removes a tenant from nodes where it owns no child).
#[derive(Default)]
struct Node {
    /// The edge's text.
    label: String,
    /// `label.chars().count()`.
    chars: usize,
    parent: usize,
    /// Keyed by the first character of the child's label.
    children: BTreeMap<char, usize>,
    /// Tenant id and the epoch of its last insert through this node.
    owners: Vec<(u32, u64)>,
}

impl Node {
    fn epoch_of(&self, t: u32) -> Option<u64> {
        self.owners.iter().find(|o| o.0 == t).map(|o| o.1)
    }
}

/// A worker's share of the tree.
struct Tenant {
    /// Characters of the labels it owns.
    chars: usize,
}

/// The multi-tenant radix tree, nodes in an arena.
struct Tree {
    nodes: Vec<Node>,
    free: Vec<usize>,
    tenant_ids: HashMap<String, u32>,
    tenants: Vec<Tenant>,
    /// Bumped once per insert.
    epoch: u64,
}

impl Tree {
    fn new() -> Tree {
        Tree {
            nodes: vec![Node::default()],
            free: Vec::new(),
            tenant_ids: HashMap::new(),
            tenants: Vec::new(),
            epoch: 0,
        }
    }

    /// The id of `addr`, registering it on first sight.
    fn tenant(&mut self, addr: &str) -> u32 {
        if let Some(&t) = self.tenant_ids.get(addr) {
            return t;
        }
        let t = self.tenants.len() as u32;
        self.tenants.push(Tenant { chars: 0 });
        self.tenant_ids.insert(addr.to_string(), t);
        t
    }

    fn owns(&self, n: usize, t: u32) -> bool {
        self.nodes[n].epoch_of(t).is_some()
    }

    fn alloc(&mut self, node: Node) -> usize {
        match self.free.pop() {
            Some(n) => {
                self.nodes[n] = node;
                n
            }
            None => {
                self.nodes.push(node);
                self.nodes.len() - 1
            }
        }
    }

    /// Marks `n` as used by `t` now.
    fn touch(&mut self, n: usize, t: u32, epoch: u64) {
        let node = &mut self.nodes[n];
        match node.owners.iter_mut().find(|o| o.0 == t) {
            Some(o) => o.1 = epoch,
            None => {
                node.owners.push((t, epoch));
                self.tenants[t as usize].chars += node.chars;
            }
        }
    }

    /// Cuts `n`'s label after `bytes` (`chars` characters): a new node takes the head
    /// and the same owners, and becomes `n`'s parent. Returns the new node.
    fn split(&mut self, n: usize, bytes: usize, chars: usize) -> usize {
        let tail = self.nodes[n].label.split_off(bytes);
        let head = std::mem::replace(&mut self.nodes[n].label, tail);
        let first_head = head.chars().next().expect("split inside a label");
        let first_tail = self.nodes[n]
            .label
            .chars()
            .next()
            .expect("split inside a label");
        let parent = self.nodes[n].parent;
        let mid = self.alloc(Node {
            label: head,
            chars,
            parent,
            children: BTreeMap::from([(first_tail, n)]),
            owners: self.nodes[n].owners.clone(),
        });
        self.nodes[n].chars -= chars;
        self.nodes[n].parent = mid;
        self.nodes[parent].children.insert(first_head, mid);
        mid
    }

    /// Records that `t` was sent `text`.
    fn insert(&mut self, text: &str, t: u32) {
        self.epoch += 1;
        let epoch = self.epoch;
        let mut cur = ROOT;
        let mut rest = text;
        while let Some(c) = rest.chars().next() {
            let Some(&child) = self.nodes[cur].children.get(&c) else {
                let leaf = self.alloc(Node {
                    label: rest.to_string(),
                    chars: rest.chars().count(),
                    parent: cur,
                    children: BTreeMap::new(),
                    owners: Vec::new(),
                });
                self.nodes[cur].children.insert(c, leaf);
                self.touch(leaf, t, epoch);
                return;
            };
            let (bytes, chars) = common_prefix(&self.nodes[child].label, rest);
            let next = if bytes < self.nodes[child].label.len() {
                self.split(child, bytes, chars)
            } else {
                child
            };
            self.touch(next, t, epoch);
            rest = &rest[bytes..];
            cur = next;
        }
    }

    /// The longest prefix of `text` held by a tenant with a `slot`: its length in
    /// characters and the tenant that used its last node most recently.
    fn best_match(&self, text: &str, slot: &[Option<usize>]) -> Option<(usize, u32)> {
        let eligible = |t: u32| slot.get(t as usize).is_some_and(Option::is_some);
        let mut cur = ROOT;
        let mut rest = text;
        let mut matched = 0;
        let mut best = None;
        while let Some(c) = rest.chars().next() {
            let Some(&child) = self.nodes[cur].children.get(&c) else {
                break;
            };
            let node = &self.nodes[child];
            let (bytes, chars) = common_prefix(&node.label, rest);
            let owner = node
                .owners
                .iter()
                .filter(|o| eligible(o.0))
                .max_by_key(|o| o.1);
            // Deeper nodes' owners are a subset of this one's: nothing more to find.
            let Some(&(t, _)) = owner else {
                break;
            };
            matched += chars;
            best = Some((matched, t));
            if bytes < node.label.len() {
                break;
            }
            rest = &rest[bytes..];
            cur = child;
        }
        best
    }

    /// Removes `t` from its least recently used leaves until it owns at most `max`
    /// characters, deleting the nodes nobody owns any more.
    fn evict(&mut self, t: u32, max: usize) {
        let mut leaves = BinaryHeap::new();
        let mut stack = vec![ROOT];
        while let Some(n) = stack.pop() {
            let before = stack.len();
            stack.extend(
                self.nodes[n]
                    .children
                    .values()
                    .copied()
                    .filter(|&c| self.owns(c, t)),
            );
            if n != ROOT && stack.len() == before {
                leaves.push(Reverse((self.nodes[n].epoch_of(t), n)));
            }
        }
        while self.tenants[t as usize].chars > max {
            let Some(Reverse((_, n))) = leaves.pop() else {
                break;
            };
            let parent = self.nodes[n].parent;
            self.disown(n, t);
            let parent_is_leaf = !self.nodes[parent]
                .children
                .values()
                .any(|&c| self.owns(c, t));
            if parent != ROOT && parent_is_leaf {
                leaves.push(Reverse((self.nodes[parent].epoch_of(t), parent)));
            }
        }
    }

    /// Removes `t` from node `n` (a leaf of `t`'s), and `n` itself if nobody owns it.
    fn disown(&mut self, n: usize, t: u32) {
        let node = &mut self.nodes[n];
        node.owners.retain(|o| o.0 != t);
        self.tenants[t as usize].chars -= node.chars;
        if node.owners.is_empty() {
            // By the ownership invariant a node nobody owns has no children.
            debug_assert!(node.children.is_empty());
            let first = node.label.chars().next().expect("non-root label");
            let parent = node.parent;
            self.nodes[n] = Node::default();
            self.nodes[parent].children.remove(&first);
            self.free.push(n);
        }
    }
}

/// The length of the common prefix of `a` and `b`, in bytes and in characters.
fn common_prefix(a: &str, b: &str) -> (usize, usize) {
    let mut bytes = 0;
    let mut chars = 0;
    for (x, y) in a.chars().zip(b.chars()) {
        if x != y {
            break;
        }
        bytes += x.len_utf8();
        chars += 1;
    }
    (bytes, chars)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const A: &str = "10.0.0.1:8000";
    const B: &str = "10.0.0.2:8000";
    const C: &str = "10.0.0.3:8000";
    const D: &str = "10.0.0.4:8000";

    fn candidates(workers: &[(&str, u64)]) -> Vec<Candidate> {
        workers
            .iter()
            .map(|&(addr, in_flight)| Candidate {
                addr: addr.to_string(),
                in_flight,
            })
            .collect()
    }

    fn pick_body(b: &mut CacheAware, body: &[u8], workers: &[(&str, u64)]) -> String {
        let c = candidates(workers);
        b.pick(&Pick {
            now: 0,
            worker: 0,
            path: "/v1/completions",
            body,
            candidates: &c,
        })
        .unwrap()
    }

    fn pick(b: &mut CacheAware, prompt: &str, workers: &[(&str, u64)]) -> String {
        let body = json!({ "model": "m", "prompt": prompt }).to_string();
        pick_body(b, body.as_bytes(), workers)
    }

    #[test]
    fn a_shared_prefix_follows_its_worker_despite_more_in_flight() {
        let mut ca = CacheAware::new();
        let system = "You are a helpful assistant. ".repeat(10);
        assert_eq!(pick(&mut ca, &format!("{system}Q1"), &[(A, 0), (B, 0)]), A);
        // A has more in flight, but below the imbalance thresholds: the prefix wins.
        let q2 = format!("{system}What is the weather like today?");
        assert_eq!(pick(&mut ca, &q2, &[(A, 60), (B, 0)]), A);
        // An unrelated text goes to the least-loaded worker.
        assert_eq!(pick(&mut ca, "something else", &[(A, 60), (B, 0)]), B);
    }

    #[test]
    fn a_match_of_at_most_the_threshold_goes_to_the_least_loaded_worker() {
        let mut ca = CacheAware::new();
        assert_eq!(pick(&mut ca, "abcdefghij", &[(A, 0), (B, 0)]), A);
        // 3 of 10 characters: exactly 30 %, not more.
        assert_eq!(pick(&mut ca, "abc0123456", &[(A, 1), (B, 0)]), B);
        // 4 of 10 against what A holds (and 3 of 10 against B): A.
        assert_eq!(pick(&mut ca, "abcd012345", &[(A, 1), (B, 0)]), A);
    }

    #[test]
    fn imbalance_sends_even_a_perfect_match_to_the_least_loaded_worker() {
        let mut ca = CacheAware::new();
        let text = "a long shared prompt that both will hold";
        assert_eq!(pick(&mut ca, text, &[(A, 0), (B, 0), (C, 0)]), A);
        // 100 vs 10: 90 > 64 and 100 > 15.
        assert_eq!(pick(&mut ca, text, &[(A, 100), (B, 10), (C, 50)]), B);
        // The text is now cached on both.
        assert_eq!(pick(&mut ca, text, &[(A, 5), (C, 0)]), A);
        assert_eq!(pick(&mut ca, text, &[(B, 5), (C, 0)]), B);
        // Each threshold alone is not enough: 60 <= 64, and 300 <= 210 * 1.5.
        assert_eq!(pick(&mut ca, text, &[(A, 70), (C, 10)]), A);
        assert_eq!(pick(&mut ca, text, &[(A, 300), (C, 210)]), A);
    }

    #[test]
    fn custom_thresholds_apply() {
        let mut ca = CacheAware::new()
            .cache_threshold(0.9)
            .balance_thresholds(2, 1.0);
        assert_eq!(pick(&mut ca, "abcdefghij", &[(A, 0), (B, 0)]), A);
        // 80 % is no longer enough.
        assert_eq!(pick(&mut ca, "abcdefgh__", &[(A, 1), (B, 0)]), B);
        // A full match is, until the loads differ by more than 2.
        assert_eq!(pick(&mut ca, "abcdefghij", &[(A, 2), (B, 0)]), A);
        assert_eq!(pick(&mut ca, "abcdefghij", &[(A, 3), (B, 0)]), B);
    }

    #[test]
    fn a_worker_missing_from_the_candidates_is_never_chosen() {
        let mut ca = CacheAware::new();
        let p = "p".repeat(100);
        let pq = format!("{p}{}", "q".repeat(100));
        assert_eq!(pick(&mut ca, &p, &[(A, 0), (B, 0)]), A);
        assert_eq!(pick(&mut ca, "unrelated", &[(A, 1), (B, 0)]), B);
        assert_eq!(pick(&mut ca, &p, &[(A, 100), (B, 0)]), B);
        assert_eq!(pick(&mut ca, &pq, &[(A, 0), (B, 100)]), A);
        // A holds all of pq, B its first half: without A, B (50 % > 30 %) even though
        // it is the busier one.
        assert_eq!(pick(&mut ca, &pq, &[(B, 5), (C, 0)]), B);
        // Nobody left holds it: least loaded.
        assert_eq!(pick(&mut ca, &pq, &[(D, 3), (C, 0)]), C);
        assert_eq!(pick(&mut ca, "xyz", &[(B, 3), (C, 0)]), C);
    }

    #[test]
    fn chat_bodies_and_prompt_arrays_are_keyed_on_their_text() {
        let chat = json!({"messages": [
            {"role": "system", "content": "You are a pirate. "},
            {"role": "user", "content": [
                {"type": "text", "text": "Say hi"},
                {"type": "image_url", "image_url": {"url": "x"}},
                {"type": "text", "text": " twice."}
            ]}
        ]})
        .to_string();
        assert_eq!(
            routing_text(chat.as_bytes()),
            "You are a pirate. Say hi twice."
        );
        let array = json!({"prompt": ["the quick brown fox", "jumps over"]}).to_string();
        assert_eq!(
            routing_text(array.as_bytes()),
            "the quick brown fox jumps over"
        );

        let mut ca = CacheAware::new();
        assert_eq!(pick_body(&mut ca, chat.as_bytes(), &[(A, 0), (B, 0)]), A);
        assert_eq!(pick_body(&mut ca, array.as_bytes(), &[(A, 1), (B, 0)]), B);
        let chat_like = "You are a pirate. Say hi twice. And bye.";
        assert_eq!(pick(&mut ca, chat_like, &[(A, 5), (B, 0)]), A);
        let array_like = "the quick brown fox jumps over the lazy dog";
        assert_eq!(pick(&mut ca, array_like, &[(A, 0), (B, 5)]), B);
    }

    #[test]
    fn a_body_without_text_goes_to_the_least_loaded_worker() {
        let mut ca = CacheAware::new();
        assert_eq!(pick(&mut ca, "cached", &[(A, 0), (B, 0)]), A);
        assert_eq!(pick_body(&mut ca, b"cached", &[(A, 3), (B, 0)]), B);
        assert_eq!(
            pick_body(&mut ca, b"{\"model\":\"m\"}", &[(A, 3), (B, 0)]),
            B
        );
        assert_eq!(pick(&mut ca, "", &[(A, 3), (B, 1), (C, 1)]), B);
        assert_eq!(ca.tree.tenant_ids.len(), 1, "nothing inserted for B");
    }

    #[test]
    fn split_nodes_keep_each_branch_with_its_worker() {
        let mut ca = CacheAware::new();
        assert_eq!(pick(&mut ca, "abcdef", &[(A, 0), (B, 0)]), A);
        assert_eq!(pick(&mut ca, "abcxyz", &[(A, 100), (B, 0)]), B);
        assert_eq!(pick(&mut ca, "abcdefgh", &[(A, 5), (B, 0)]), A);
        assert_eq!(pick(&mut ca, "abcxyzgh", &[(A, 0), (B, 5)]), B);
        assert_eq!(pick(&mut ca, "abcdef", &[(A, 0), (B, 5)]), A);
        // "abc" alone is shared by both: the most recent user of it.
        assert_eq!(pick(&mut ca, "abc", &[(A, 5), (B, 0)]), A);
        let t = &ca.tree;
        let (a, b) = (t.tenant_ids[A] as usize, t.tenant_ids[B] as usize);
        assert_eq!(t.tenants[a].chars, "abcdefgh".len());
        assert_eq!(t.tenants[b].chars, "abcxyzgh".len());
    }

    #[test]
    fn multibyte_characters_are_split_on_character_boundaries() {
        // '✓' and '✗' share their first two UTF-8 bytes.
        let mut ca = CacheAware::new();
        assert_eq!(pick(&mut ca, "héllo ✓", &[(A, 0), (B, 0)]), A);
        assert_eq!(pick(&mut ca, "héllo ✗", &[(A, 100), (B, 0)]), B);
        assert_eq!(pick(&mut ca, "héllo ✓ wörld", &[(A, 5), (B, 0)]), A);
        assert_eq!(pick(&mut ca, "héllo ✗ wörld", &[(A, 0), (B, 5)]), B);
    }

    #[test]
    fn eviction_drops_a_workers_oldest_texts_first() {
        let mut ca = CacheAware::new().max_tree_size(20);
        let (a, b, c) = ("a".repeat(10), "b".repeat(10), "c".repeat(10));
        for text in [&a, &b, &c] {
            assert_eq!(pick(&mut ca, text, &[(A, 0), (B, 0)]), A);
        }
        let t = &ca.tree;
        assert_eq!(t.tenants[t.tenant_ids[A] as usize].chars, 20);
        // The oldest text no longer follows A; the newer ones still do.
        assert_eq!(pick(&mut ca, &b, &[(A, 3), (B, 0)]), A);
        assert_eq!(pick(&mut ca, &c, &[(A, 3), (B, 0)]), A);
        assert_eq!(pick(&mut ca, &a, &[(A, 3), (B, 0)]), B);
    }

    #[test]
    fn eviction_keeps_the_prefixes_newer_texts_share() {
        let mut tree = Tree::new();
        let a = tree.tenant(A);
        let b = tree.tenant(B);
        tree.insert("xxxxxyyyyy", a);
        tree.insert("xxxxxzzzzz", a);
        tree.insert("xxxxxyyyyy", b);
        tree.insert("ccccc", a);
        assert_eq!(tree.tenants[a as usize].chars, 20);
        tree.evict(a, 15);
        assert_eq!(tree.tenants[a as usize].chars, 15);
        let only_a = [Some(0), None];
        assert_eq!(tree.best_match("xxxxxyyyyy", &only_a), Some((5, a)));
        assert_eq!(tree.best_match("xxxxxzzzzz", &only_a), Some((10, a)));
        assert_eq!(tree.best_match("ccccc", &only_a), Some((5, a)));
        // B's copy of the evicted text is untouched.
        assert_eq!(
            tree.best_match("xxxxxyyyyy", &[None, Some(0)]),
            Some((10, b))
        );
        // Evicting everything deletes the nodes only A held.
        tree.evict(a, 0);
        assert_eq!(tree.tenants[a as usize].chars, 0);
        assert_eq!(tree.nodes[ROOT].children.len(), 1, "only B's x… branch");
        assert_eq!(
            tree.best_match("xxxxxyyyyy", &[None, Some(0)]),
            Some((10, b))
        );
        tree.insert("xxxxxzzzzz", a);
        assert_eq!(tree.best_match("xxxxxzzzzz", &only_a), Some((10, a)));
    }

    #[test]
    fn groups_sharing_a_system_prompt_stay_together_and_the_tree_stays_compact() {
        let workers = [A, B, C, D];
        let mut ca = CacheAware::new();
        let mut home: Vec<Option<String>> = vec![None; 8];
        let texts = 400;
        for i in 0..texts {
            let group = i % home.len();
            let system = format!("system prompt of group {group}: ").repeat(150);
            let text = format!("{system}question {i} {}", "?".repeat(i % 97));
            // A different worker is the least loaded each time: the cache decides.
            let loads: Vec<(&str, u64)> = (0..workers.len())
                .map(|j| (workers[j], u64::from(j != i % workers.len())))
                .collect();
            let got = pick(&mut ca, &text, &loads);
            let want = home[group].get_or_insert_with(|| got.clone());
            assert_eq!(&got, want, "request {i} of group {group}");
        }
        let mut used: Vec<_> = home.iter().flatten().collect();
        used.sort();
        used.dedup();
        assert_eq!(used.len(), workers.len(), "groups spread over {used:?}");
        // Compressed: at most one leaf and one branching node per text.
        let live = ca.tree.nodes.len() - ca.tree.free.len();
        assert!(live <= 2 * texts + 1, "{live} nodes for {texts} texts");
    }

    #[test]
    fn no_candidates_means_no_pick() {
        let body = json!({"prompt": "hi"}).to_string();
        let got = CacheAware::new().pick(&Pick {
            now: 0,
            worker: 0,
            path: "/v1/completions",
            body: body.as_bytes(),
            candidates: &[],
        });
        assert!(got.is_none());
    }
}
