//! Provider-safe tool names and the way back.

use std::collections::BTreeMap;

use sha2::{Digest, Sha256};
use soulbase_types::ToolId;

/// The most characters a provider accepts in a tool name.
const MAX_LEN: usize = 64;
/// Hex digits of the id hash in a hashed name (48 bits).
const HASH_HEX: usize = 12;

/// A two-way mapping between tool ids and names matching `^[a-zA-Z0-9_-]{1,64}$`.
///
/// The preferred name ([`NameMap::provider_name`]) depends on the id alone:
/// - dots become `__` (`fs.files.read_file` → `fs__files__read_file`) when that
///   decodes back to the same id and fits in 64 characters;
/// - otherwise (too long, or ambiguous because a segment contains `__` or ends with
///   `_`) it is a readable prefix plus `_H` and 12 hex digits of the id's SHA-256.
///   Plain names never contain an upper-case letter (ids are lower case), so a
///   hashed name can never equal a plain one.
///
/// A map is built for the exact set of tools shown to a model; [`NameMap::to_id`]
/// answers only for those, so a model that invents a name gets `None`. If two
/// hashed names ever collide within one map, the later id (in id order) gets a
/// longer hash.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NameMap {
    by_id: BTreeMap<ToolId, String>,
    by_name: BTreeMap<String, ToolId>,
}

impl NameMap {
    /// Builds the map for `ids` (duplicates are ignored).
    pub fn new<'a>(ids: impl IntoIterator<Item = &'a ToolId>) -> Self {
        let mut sorted: Vec<&ToolId> = ids.into_iter().collect();
        sorted.sort();
        sorted.dedup();
        let mut map = NameMap::default();
        for id in sorted {
            map.assign(id);
        }
        map
    }

    /// Gives `id` its preferred name, or a longer-hashed one if that is taken.
    fn assign(&mut self, id: &ToolId) {
        let mut name = Self::provider_name(id);
        let mut hex_len = HASH_HEX;
        // Only hashed names can collide (plain names are injective and never equal
        // a hashed one); lengthen the hash until free. 62 hex digits (all a name
        // has room for) of SHA-256 cannot collide in practice, so the loop ends
        // with a free name.
        while self.by_name.contains_key(&name) && hex_len < MAX_LEN - 2 {
            hex_len += 4;
            name = hashed(id, hex_len);
        }
        self.by_name.insert(name.clone(), id.clone());
        self.by_id.insert(id.clone(), name);
    }

    /// The preferred provider name of `id` (see the type's documentation).
    pub fn provider_name(id: &ToolId) -> String {
        let plain = id.as_str().replace('.', "__");
        if plain.len() <= MAX_LEN && decode_plain(&plain).as_ref() == Some(id) {
            plain
        } else {
            hashed(id, HASH_HEX)
        }
    }

    /// The tool id a *plain* provider name stands for (`fs__files__read_file` →
    /// `fs.files.read_file`), with no map: `None` for a hashed name or anything
    /// that is not one. Lets every surface accept the names an export gave.
    pub fn plain_id(name: &str) -> Option<ToolId> {
        decode_plain(name).filter(|id| Self::provider_name(id) == name)
    }

    /// The provider name of `id`, if it is in the map.
    pub fn name(&self, id: &ToolId) -> Option<&str> {
        self.by_id.get(id).map(String::as_str)
    }

    /// The tool id behind a provider name, if the name is in the map.
    pub fn to_id(&self, name: &str) -> Option<ToolId> {
        self.by_name.get(name).cloned()
    }

    /// How many tools are mapped.
    pub fn len(&self) -> usize {
        self.by_id.len()
    }

    /// Whether the map is empty.
    pub fn is_empty(&self) -> bool {
        self.by_id.is_empty()
    }

    /// Every (id, name) pair, in id order.
    pub fn iter(&self) -> impl Iterator<Item = (&ToolId, &str)> {
        self.by_id.iter().map(|(id, n)| (id, n.as_str()))
    }
}

fn decode_plain(name: &str) -> Option<ToolId> {
    let parts: Vec<&str> = name.split("__").collect();
    match parts.as_slice() {
        [g, p, n] => ToolId::from_parts(g, p, n).ok(),
        _ => None,
    }
}

/// `<prefix>_H<hex>` within 64 characters, where `hex` is the first `hex_len`
/// (≤ 62) hex digits of SHA-256(id).
fn hashed(id: &ToolId, hex_len: usize) -> String {
    let digest = hex::encode(Sha256::digest(id.as_str().as_bytes()));
    let hex_len = hex_len.min(MAX_LEN - 2);
    let keep = MAX_LEN.saturating_sub(2 + hex_len);
    let plain = id.as_str().replace('.', "__");
    // Ids are ASCII, so byte slicing is safe; `get` keeps it panic-free regardless.
    let prefix = plain.get(..keep.min(plain.len())).unwrap_or_default();
    format!("{prefix}_H{}", digest.get(..hex_len).unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(s: &str) -> ToolId {
        ToolId::new(s).unwrap()
    }

    fn is_safe(name: &str) -> bool {
        !name.is_empty()
            && name.len() <= 64
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    }

    #[test]
    fn plain_names_round_trip() {
        let ids = [id("fs.files.read_file"), id("web.search.query-v2")];
        let map = NameMap::new(&ids);
        assert_eq!(map.name(&ids[0]), Some("fs__files__read_file"));
        for i in &ids {
            let n = map.name(i).unwrap();
            assert!(is_safe(n));
            assert_eq!(map.to_id(n).as_ref(), Some(i));
        }
        assert_eq!(map.to_id("fs__files__write_file"), None, "not exported");
        assert_eq!(map.len(), 2);
    }

    #[test]
    fn ambiguous_ids_get_distinct_hashed_names() {
        // Both would be "a__b__c__d" with dots → "__".
        let a = id("a__b.c.d");
        let b = id("a.b__c.d");
        let c = id("a_.b.c");
        let map = NameMap::new([&a, &b, &c]);
        let (na, nb, nc) = (
            map.name(&a).unwrap(),
            map.name(&b).unwrap(),
            map.name(&c).unwrap(),
        );
        assert_ne!(na, nb);
        for n in [na, nb, nc] {
            assert!(is_safe(n), "{n}");
            assert!(n.contains("_H"), "{n}");
        }
        assert_eq!(map.to_id(na), Some(a));
        assert_eq!(map.to_id(nb), Some(b));
        assert_eq!(map.to_id(nc), Some(c));
    }

    #[test]
    fn long_ids_are_hashed_within_64() {
        let long = id(&format!(
            "{}.{}.{}",
            "g".repeat(40),
            "p".repeat(40),
            "n".repeat(40)
        ));
        let long2 = id(&format!(
            "{}.{}.{}",
            "g".repeat(40),
            "p".repeat(40),
            "m".repeat(40)
        ));
        let map = NameMap::new([&long, &long2]);
        let (n1, n2) = (map.name(&long).unwrap(), map.name(&long2).unwrap());
        assert!(is_safe(n1) && is_safe(n2));
        assert_eq!(n1.len(), 64);
        assert_ne!(n1, n2, "same prefix, different hash");
        assert_eq!(map.to_id(n1), Some(long));
        assert_eq!(map.to_id(n2), Some(long2));
    }

    #[test]
    fn names_do_not_depend_on_the_set() {
        let a = id("a__b.c.d");
        let alone = NameMap::new([&a]);
        let with_other = NameMap::new([&a, &id("x.y.z")]);
        assert_eq!(alone.name(&a), with_other.name(&a));
        assert_eq!(
            alone.name(&a).map(str::to_owned),
            Some(NameMap::provider_name(&a))
        );
    }

    #[test]
    fn hash_collisions_are_resolved() {
        // Force a collision by pre-seeding the name the hashed id would get.
        let a = id("a__b.c.d");
        let taken = NameMap::provider_name(&a);
        let mut map = NameMap::default();
        map.by_name.insert(taken.clone(), id("z.z.z"));
        map.assign(&a);
        let name = map.name(&a).unwrap().to_owned();
        assert_ne!(name, taken);
        assert!(is_safe(&name), "{name}");
        assert_eq!(map.to_id(&name), Some(a));
        assert_eq!(map.to_id(&taken), Some(id("z.z.z")));
    }
}
