//! A run record's JSON documents (its request, policy and result) kept as the text they were
//! serialised to, once.
//!
//! Why not `serde_json::Value`: a waited run's documents were each built as a tree of maps
//! (an allocation per key and value), written out for the store's row, written out again into
//! the answer, then freed, all on the request's thread before and after the library's run.
//! As text they are written once (from the typed policy and result, not through a tree),
//! bound as is in the row and copied as is into the answer (`RawValue`); a field inside is
//! read by a pass over the text where one is needed (the start path, the audit's warnings).

use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::value::RawValue;

/// One JSON document (object, array or any value) as its text.
#[derive(Clone, Debug)]
pub struct Document(Box<RawValue>);

impl Document {
    /// `value` serialised.
    pub fn of<T: Serialize + ?Sized>(value: &T) -> Result<Document, serde_json::Error> {
        serde_json::value::to_raw_value(value).map(Document)
    }

    /// A document from its text (a stored row's column): checked to be JSON, not parsed
    /// into a tree.
    pub fn parse(text: String) -> Result<Document, serde_json::Error> {
        RawValue::from_string(text).map(Document)
    }

    /// The document's text, as stored.
    pub fn text(&self) -> &str {
        self.0.get()
    }

    /// The document as a tree, for a reader of more than a field or two.
    pub fn value(&self) -> serde_json::Value {
        serde_json::from_str(self.text()).unwrap_or_default()
    }

    /// The fields of the document that `T` names (serde skips the others), or `None` when
    /// they do not fit `T`.
    pub fn read<T: DeserializeOwned>(&self) -> Option<T> {
        serde_json::from_str(self.text()).ok()
    }
}

impl From<serde_json::Value> for Document {
    fn from(value: serde_json::Value) -> Document {
        // A tree from serde_json always serialises (its map keys are strings).
        Document::of(&value).unwrap_or_else(|_| Document::of(&serde_json::Value::Null).unwrap())
    }
}

/// Written as is: the text is JSON already.
impl Serialize for Document {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(serializer)
    }
}

/// Read through a tree, so that any deserializer works (`serde_json::from_value` too, which
/// cannot hand out raw text).
impl<'de> Deserialize<'de> for Document {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Document, D::Error> {
        let value = serde_json::Value::deserialize(deserializer)?;
        Document::of(&value).map_err(serde::de::Error::custom)
    }
}

/// Equal as JSON (the same tree), whatever the spacing or the order of keys.
impl PartialEq for Document {
    fn eq(&self, other: &Document) -> bool {
        self.text() == other.text() || self.value() == other.value()
    }
}

#[cfg(test)]
mod tests {
    use super::Document;
    use serde_json::json;

    #[test]
    fn a_document_is_written_into_a_larger_one_as_it_is() {
        let document = Document::of(&json!({"b": [1, 2], "a": null})).unwrap();
        let wrapped = serde_json::to_string(&vec![&document]).unwrap();
        assert_eq!(wrapped, format!("[{}]", document.text()));
        assert_eq!(document.value(), json!({"a": null, "b": [1, 2]}));
    }

    #[test]
    fn documents_compare_as_json_and_read_back_through_any_deserializer() {
        let spaced = Document::parse(r#"{ "a" : 1, "b" : [true] }"#.into()).unwrap();
        let compact = Document::from(json!({"b": [true], "a": 1}));
        assert_eq!(spaced, compact);
        assert_ne!(spaced, Document::from(json!({"a": 2})));
        let back: Document = serde_json::from_value(json!({"a": 1, "b": [true]})).unwrap();
        assert_eq!(back, spaced);
        assert!(Document::parse("{not json".into()).is_err());
    }

    #[test]
    fn a_reader_takes_only_the_fields_it_names() {
        #[derive(serde::Deserialize)]
        struct Start {
            start: Option<String>,
        }
        let document = Document::from(json!({"exit_code": 0, "start": "cold"}));
        let start: Start = document.read().unwrap();
        assert_eq!(start.start.as_deref(), Some("cold"));
        assert!(document.read::<u32>().is_none());
    }
}
