//! The OpenAI Conversations API (`/v1/conversations`): conversations and their items,
//! kept in memory by each server (rank). Bounded: past [`Conversations::capacity`] the
//! oldest conversation is forgotten. Nothing here touches the engine.
//!
//! * `POST /v1/conversations` `{items?, metadata?}` → the conversation object
//!   `{id, object: "conversation", created_at, metadata}`;
//! * `GET`, `POST` (new `metadata`), `DELETE /v1/conversations/{id}`;
//! * `GET`, `POST` (`{items}`) `/v1/conversations/{id}/items` → a list of items.

use super::errors::ApiError;
use super::openai::json_error;
use serde_json::{json, Map, Value};
use std::collections::{HashMap, VecDeque};

/// One conversation.
#[derive(Clone, Debug, PartialEq)]
pub struct Conversation {
    pub id: String,
    pub created_at: u64,
    pub metadata: Value,
    pub items: Vec<Value>,
}

impl Conversation {
    /// The conversation object.
    pub fn to_json(&self) -> String {
        json!({"id": self.id, "object": "conversation", "created_at": self.created_at,
               "metadata": self.metadata})
        .to_string()
    }
}

/// The conversations of one server.
#[derive(Clone, Debug)]
pub struct Conversations {
    map: HashMap<String, Conversation>,
    /// Ids in creation order, for eviction.
    order: VecDeque<String>,
    /// Distinguishes this server's ids from another's.
    salt: u64,
    next: u64,
    capacity: usize,
}

/// The body of a create, update or add-items request.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ConversationBody {
    /// `metadata`: an object of strings (at most 16), if given.
    pub metadata: Option<Value>,
    /// `items`, if given.
    pub items: Vec<Value>,
}

/// Parses a conversations request body; an empty body is an empty object.
pub fn parse(body: &[u8]) -> Result<ConversationBody, ApiError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(ConversationBody::default());
    }
    let Value::Object(obj) = serde_json::from_slice(body).map_err(json_error)? else {
        return Err(ApiError::bad_request("request body must be a JSON object"));
    };
    let metadata = match obj.get("metadata") {
        None | Some(Value::Null) => None,
        Some(Value::Object(m)) if m.len() <= 16 && m.values().all(Value::is_string) => {
            Some(Value::Object(m.clone()))
        }
        Some(_) => {
            return Err(ApiError::bad_request(
                "metadata must be an object of at most 16 string values",
            )
            .with_param("metadata"))
        }
    };
    let items = match obj.get("items") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(items)) if items.iter().all(Value::is_object) => items.clone(),
        Some(_) => {
            return Err(ApiError::bad_request("items must be a list of objects").with_param("items"))
        }
    };
    Ok(ConversationBody { metadata, items })
}

/// The 404 of an unknown conversation.
pub fn not_found(id: &str) -> ApiError {
    ApiError::new(404, format!("Conversation with id '{id}' not found.")).with_param("id")
}

/// A list of items.
pub fn items_json(items: &[Value]) -> String {
    json!({"object": "list", "data": items, "first_id": items.first().map(|i| &i["id"]),
           "last_id": items.last().map(|i| &i["id"]), "has_more": false})
    .to_string()
}

impl Conversations {
    /// A store for at most `capacity` conversations; `salt` goes into the ids.
    pub fn new(salt: u64, capacity: usize) -> Self {
        Conversations {
            map: HashMap::new(),
            order: VecDeque::new(),
            salt,
            next: 1,
            capacity: capacity.max(1),
        }
    }

    /// How many conversations are kept at most.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    fn new_id(&mut self, prefix: &str) -> String {
        let n = self.next;
        self.next += 1;
        format!("{prefix}_{:016x}{n:016x}", self.salt)
    }

    /// Gives each item an `id` (and a `type`, `message` by default) if it has none.
    fn identify(&mut self, items: Vec<Value>) -> Vec<Value> {
        items
            .into_iter()
            .map(|mut item| {
                if let Value::Object(o) = &mut item {
                    if !o.contains_key("id") {
                        let id = self.new_id("msg");
                        o.insert("id".into(), json!(id));
                    }
                    o.entry("type").or_insert_with(|| json!("message"));
                }
                item
            })
            .collect()
    }

    /// Creates a conversation at `now` (Unix seconds).
    pub fn create(&mut self, body: ConversationBody, now: u64) -> &Conversation {
        while self.map.len() >= self.capacity {
            match self.order.pop_front() {
                Some(old) => {
                    self.map.remove(&old);
                }
                None => break,
            }
        }
        let id = self.new_id("conv");
        let items = self.identify(body.items);
        let conversation = Conversation {
            id: id.clone(),
            created_at: now,
            metadata: body.metadata.unwrap_or_else(|| Value::Object(Map::new())),
            items,
        };
        self.order.push_back(id.clone());
        self.map.entry(id).or_insert(conversation)
    }

    pub fn get(&self, id: &str) -> Option<&Conversation> {
        self.map.get(id)
    }

    /// Replaces the metadata.
    pub fn update(&mut self, id: &str, metadata: Value) -> Option<&Conversation> {
        let c = self.map.get_mut(id)?;
        c.metadata = metadata;
        Some(c)
    }

    /// Deletes a conversation; the deletion object if it existed.
    pub fn delete(&mut self, id: &str) -> Option<String> {
        self.map.remove(id)?;
        self.order.retain(|o| o != id);
        Some(json!({"id": id, "object": "conversation.deleted", "deleted": true}).to_string())
    }

    /// Appends items; returns the items added (with their ids).
    pub fn add_items(&mut self, id: &str, items: Vec<Value>) -> Option<Vec<Value>> {
        if !self.map.contains_key(id) {
            return None;
        }
        let items = self.identify(items);
        let c = self.map.get_mut(id)?;
        c.items.extend(items.iter().cloned());
        Some(items)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn create_get_items_delete() {
        let mut store = Conversations::new(7, 10);
        let body = parse(br#"{"metadata":{"topic":"demo"},"items":[{"type":"message","role":"user","content":"hi"}]}"#).unwrap();
        let c = store.create(body, 1234).clone();
        let v: Value = serde_json::from_str(&c.to_json()).unwrap();
        assert_eq!(v["object"], "conversation");
        assert_eq!(v["created_at"], 1234);
        assert_eq!(v["metadata"]["topic"], "demo");
        assert!(c.id.starts_with("conv_"));
        assert_eq!(store.get(&c.id), Some(&c));
        assert!(store.get("conv_other").is_none());

        let added = store
            .add_items(
                &c.id,
                parse(br#"{"items":[{"role":"assistant","content":"hello"}]}"#)
                    .unwrap()
                    .items,
            )
            .unwrap();
        assert!(added[0]["id"].as_str().unwrap().starts_with("msg_"));
        assert_eq!(added[0]["type"], "message");
        let all = &store.get(&c.id).unwrap().items;
        assert_eq!(all.len(), 2);
        let list: Value = serde_json::from_str(&items_json(all)).unwrap();
        assert_eq!(list["object"], "list");
        assert_eq!(list["last_id"], added[0]["id"]);

        let deleted: Value = serde_json::from_str(&store.delete(&c.id).unwrap()).unwrap();
        assert_eq!(deleted["deleted"], true);
        assert!(store.get(&c.id).is_none());
        assert_eq!(not_found("x").status, 404);
    }

    #[test]
    fn empty_bodies_bad_bodies_and_eviction() {
        assert_eq!(parse(b"").unwrap(), ConversationBody::default());
        assert_eq!(parse(b"{").unwrap_err().status, 400);
        assert_eq!(parse(br#"{"metadata":{"n":1}}"#).unwrap_err().status, 400);
        assert_eq!(parse(br#"{"items":"x"}"#).unwrap_err().status, 400);
        let mut store = Conversations::new(0, 2);
        let ids: Vec<String> = (0..3)
            .map(|_| store.create(ConversationBody::default(), 0).id.clone())
            .collect();
        assert!(store.get(&ids[0]).is_none());
        assert!(store.get(&ids[2]).is_some());
        assert_eq!(store.get(&ids[1]).unwrap().metadata, json!({}));
    }
}
