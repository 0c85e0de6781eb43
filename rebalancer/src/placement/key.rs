//! What the books key an admitted pod by ([`AllocKey`]): a pod the API admitted (or one admitted
//! a container at a time, pod scope), a single-container pod the watcher or NRI admitted for
//! one container of a Kubernetes pod, or kubelet's own assignment adopted from its state
//! files. Each is released differently (by the API's DELETE, when its container goes, when
//! kubelet's files drop it), so the kind is part of the key rather than read from its text.
//!
//! A key is written (checkpoint, status) as the text it always had: `<uid>`,
//! `<pod uid>/<container>`, `kubelet:<pod uid>`; [`AllocKey::parse`] reads that text back.

use std::{borrow::Borrow, cmp::Ordering, fmt};

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::pod::RESERVED_UID_PREFIX;

/// Who admitted a pod, and so what releases it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyKind {
    /// A pod admitted whole through the API, or one container at a time (pod scope).
    Pod,
    /// A single-container pod the watcher or NRI admitted for one container.
    Container,
    /// kubelet's CPU / Memory Manager assignment of a pod (`daemon::kubelet`).
    Kubelet,
}

/// An admitted pod's key in the books. Ordered, compared and hashed as its text, so the books
/// can be looked up by a `&str`.
#[derive(Clone)]
pub struct AllocKey {
    text: String,
    kind: KeyKind,
}

impl AllocKey {
    pub fn pod(uid: &str) -> AllocKey {
        AllocKey {
            text: uid.to_string(),
            kind: KeyKind::Pod,
        }
    }

    pub fn container(pod_uid: &str, container: &str) -> AllocKey {
        AllocKey {
            text: format!("{pod_uid}/{container}"),
            kind: KeyKind::Container,
        }
    }

    pub fn kubelet(pod_uid: &str) -> AllocKey {
        AllocKey {
            text: format!("{RESERVED_UID_PREFIX}{pod_uid}"),
            kind: KeyKind::Kubelet,
        }
    }

    /// The key written as `text` (a checkpoint's, a pod's uid as a door built it).
    pub fn parse(text: &str) -> AllocKey {
        let kind = if text.starts_with(RESERVED_UID_PREFIX) {
            KeyKind::Kubelet
        } else if text.contains('/') {
            KeyKind::Container
        } else {
            KeyKind::Pod
        };
        AllocKey {
            text: text.to_string(),
            kind,
        }
    }

    pub fn kind(&self) -> KeyKind {
        self.kind
    }

    /// A single-container pod of the watcher or NRI, released when its container goes.
    pub fn is_container(&self) -> bool {
        self.kind == KeyKind::Container
    }

    pub fn is_kubelet(&self) -> bool {
        self.kind == KeyKind::Kubelet
    }

    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// The Kubernetes pod's uid.
    pub fn pod_uid(&self) -> &str {
        match self.kind {
            KeyKind::Pod => &self.text,
            KeyKind::Container => self.text.split('/').next().unwrap_or_default(),
            KeyKind::Kubelet => &self.text[RESERVED_UID_PREFIX.len()..],
        }
    }

    /// A single-container pod's container part (`<pod uid>/<container>`).
    pub fn container_part(&self) -> Option<&str> {
        (self.kind == KeyKind::Container)
            .then(|| self.text.split_once('/').map(|(_, c)| c))
            .flatten()
    }
}

impl From<&str> for AllocKey {
    fn from(text: &str) -> AllocKey {
        AllocKey::parse(text)
    }
}

impl From<String> for AllocKey {
    fn from(text: String) -> AllocKey {
        AllocKey::parse(&text)
    }
}

impl From<&String> for AllocKey {
    fn from(text: &String) -> AllocKey {
        AllocKey::parse(text)
    }
}

/// Read as its text where a uid is wanted (lookups, logs, the allocator's `&str` arguments).
impl std::ops::Deref for AllocKey {
    type Target = str;
    fn deref(&self) -> &str {
        &self.text
    }
}

impl Borrow<String> for AllocKey {
    fn borrow(&self) -> &String {
        &self.text
    }
}

impl Borrow<str> for AllocKey {
    fn borrow(&self) -> &str {
        &self.text
    }
}

impl PartialEq for AllocKey {
    fn eq(&self, o: &AllocKey) -> bool {
        self.text == o.text
    }
}

impl Eq for AllocKey {}

impl PartialEq<str> for AllocKey {
    fn eq(&self, o: &str) -> bool {
        self.text == o
    }
}

impl PartialEq<&str> for AllocKey {
    fn eq(&self, o: &&str) -> bool {
        self.text == *o
    }
}

impl PartialEq<String> for AllocKey {
    fn eq(&self, o: &String) -> bool {
        &self.text == o
    }
}

impl PartialOrd for AllocKey {
    fn partial_cmp(&self, o: &AllocKey) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}

impl Ord for AllocKey {
    fn cmp(&self, o: &AllocKey) -> Ordering {
        self.text.cmp(&o.text)
    }
}

impl std::hash::Hash for AllocKey {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        self.text.hash(h)
    }
}

impl fmt::Display for AllocKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl fmt::Debug for AllocKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.text, f)
    }
}

impl Serialize for AllocKey {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.text)
    }
}

impl<'de> Deserialize<'de> for AllocKey {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<AllocKey, D::Error> {
        String::deserialize(d).map(AllocKey::from)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_kind_reads_back_from_its_text_as_older_checkpoints_hold_it() {
        for k in [
            AllocKey::pod("6c1b"),
            AllocKey::container("6c1b", "a1b2c3d4e5f6"),
            AllocKey::kubelet("6c1b"),
        ] {
            let json = serde_json::to_string(&k).unwrap();
            let back: AllocKey = serde_json::from_str(&json).unwrap();
            assert_eq!((back.as_str(), back.kind()), (k.as_str(), k.kind()));
        }
        assert_eq!(AllocKey::container("u", "c").as_str(), "u/c");
        assert_eq!(AllocKey::container("u", "c").pod_uid(), "u");
        assert_eq!(AllocKey::container("u", "c").container_part(), Some("c"));
        assert_eq!(AllocKey::kubelet("u").pod_uid(), "u");
        assert_eq!(AllocKey::pod("u").container_part(), None);
        assert_eq!(AllocKey::kubelet("u").as_str(), "kubelet:u");
        let m: std::collections::BTreeMap<AllocKey, u8> = [(AllocKey::pod("u"), 1)].into();
        assert_eq!(m.get("u"), Some(&1), "looked up by its text");
    }
}
