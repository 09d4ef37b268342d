//! How the gate's 32-byte ids go into and come out of its two databases: [`DecisionId`] (the
//! BLAKE3 of a receipt body) and [`Hash`] (a keyed request fingerprint).
//!
//! Every SQL conversion of the two types lives in this one file, behind the cargo features
//! `sqlite` (rusqlite) and `postgres` (postgres-types): the server turns them on; the gate
//! core's own users need neither.
//!
//! - **SQLite** stores them as 32-byte BLOBs (schema migration 2). Rows written before that
//!   migration as text which it left as text (not 64 *lowercase* hex digits, e.g. upper case)
//!   still read back when they are 64 hex digits; any other value is a conversion error.
//! - **PostgreSQL** (the fleet) keeps its `text` columns and the impls write and read the
//!   64 lowercase hex digits. Chosen over a migration to `bytea` because the fleet's queries
//!   compare these columns with text-typed parameters (`$2::text`, the `(decided_at_ms,
//!   decision_id)` page cursor) and its `row_json` copies carry the same hex, so text keeps one
//!   spelling of an id in every column an operator reads with `psql`; a `decode(col, 'hex')`
//!   migration would also abort on any row whose id is not hex, leaving a fleet that cannot
//!   start, for a saving of 32 bytes per id on tables that are pruned anyway.

#[cfg(feature = "postgres")]
use std::error::Error;

#[cfg(feature = "postgres")]
use bytes::BytesMut;
#[cfg(feature = "postgres")]
use postgres_types::{self as pg, IsNull, Type};
#[cfg(feature = "sqlite")]
use rusqlite::types::{FromSql, FromSqlError, FromSqlResult, ToSql, ToSqlOutput, ValueRef};

use crate::receipt::DecisionId;
use crate::request::Hash;

/// A stored value that is neither 32 bytes nor 64 hex digits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("a stored id is neither 32 bytes nor 64 hex digits")]
pub struct MalformedStoredId;

#[cfg(feature = "sqlite")]
/// 32 bytes from a BLOB of 32 bytes or a (legacy) TEXT of 64 hex digits.
fn sqlite_bytes32(value: ValueRef<'_>) -> FromSqlResult<[u8; 32]> {
    match value {
        ValueRef::Blob(bytes) => <[u8; 32]>::try_from(bytes)
            .map_err(|_| FromSqlError::Other(Box::new(MalformedStoredId))),
        ValueRef::Text(text) => {
            let mut out = [0u8; 32];
            hex::decode_to_slice(text, &mut out)
                .map_err(|_| FromSqlError::Other(Box::new(MalformedStoredId)))?;
            Ok(out)
        }
        _ => Err(FromSqlError::InvalidType),
    }
}

#[cfg(feature = "postgres")]
/// 32 bytes from a PostgreSQL text value of 64 hex digits.
fn pg_bytes32(ty: &Type, raw: &[u8]) -> Result<[u8; 32], Box<dyn Error + Sync + Send>> {
    let text = <&str as pg::FromSql>::from_sql(ty, raw)?;
    let mut out = [0u8; 32];
    hex::decode_to_slice(text, &mut out).map_err(|_| Box::new(MalformedStoredId))?;
    Ok(out)
}

#[cfg(feature = "postgres")]
/// Writes the 64 lowercase hex digits of `bytes` as PostgreSQL text.
fn pg_write_hex(
    bytes: &[u8; 32],
    ty: &Type,
    out: &mut BytesMut,
) -> Result<IsNull, Box<dyn Error + Sync + Send>> {
    let mut digits = [0u8; 64];
    hex::encode_to_slice(bytes, &mut digits)?;
    let text = std::str::from_utf8(&digits)?;
    <&str as pg::ToSql>::to_sql(&text, ty, out)
}

macro_rules! sql_bytes32 {
    ($type:ident) => {
        #[cfg(feature = "sqlite")]
        impl ToSql for $type {
            fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
                Ok(ToSqlOutput::Borrowed(ValueRef::Blob(&self.0)))
            }
        }

        #[cfg(feature = "sqlite")]
        impl FromSql for $type {
            fn column_result(value: ValueRef<'_>) -> FromSqlResult<Self> {
                sqlite_bytes32(value).map($type)
            }
        }

        #[cfg(feature = "postgres")]
        impl pg::ToSql for $type {
            fn to_sql(
                &self,
                ty: &Type,
                out: &mut BytesMut,
            ) -> Result<IsNull, Box<dyn Error + Sync + Send>> {
                pg_write_hex(&self.0, ty, out)
            }

            fn accepts(ty: &Type) -> bool {
                <&str as pg::ToSql>::accepts(ty)
            }

            pg::to_sql_checked!();
        }

        #[cfg(feature = "postgres")]
        impl<'a> pg::FromSql<'a> for $type {
            fn from_sql(ty: &Type, raw: &'a [u8]) -> Result<Self, Box<dyn Error + Sync + Send>> {
                pg_bytes32(ty, raw).map($type)
            }

            fn accepts(ty: &Type) -> bool {
                <&str as pg::FromSql>::accepts(ty)
            }
        }
    };
}

sql_bytes32!(DecisionId);
sql_bytes32!(Hash);

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(feature = "sqlite")]
    use rusqlite::Connection;

    fn id(tag: &str) -> DecisionId {
        crate::receipt::decision_id(tag.as_bytes())
    }

    #[cfg(feature = "sqlite")]
    #[test]
    fn sqlite_writes_blobs_and_reads_blobs_and_legacy_text() {
        let conn = Connection::open_in_memory().unwrap();
        conn.execute_batch("CREATE TABLE t (v)").unwrap();
        let written = id("a");
        conn.execute("INSERT INTO t VALUES (?1)", [written])
            .unwrap();
        let (kind, back): (String, DecisionId) = conn
            .query_row("SELECT typeof(v), v FROM t", [], |r| {
                Ok((r.get(0)?, r.get(1)?))
            })
            .unwrap();
        assert_eq!((kind.as_str(), back), ("blob", written));
        let fingerprint: Hash = conn.query_row("SELECT v FROM t", [], |r| r.get(0)).unwrap();
        assert_eq!(fingerprint.0, written.0);

        // Text rows schema 2 left as text: upper-case hex still reads as its bytes.
        let legacy = id("legacy");
        let upper = legacy.to_string().to_uppercase();
        let lower = legacy.to_string();
        for text in [&upper, &lower] {
            let back: DecisionId = conn.query_row("SELECT ?1", [text], |r| r.get(0)).unwrap();
            assert_eq!(back, legacy);
        }
        for bad in [
            rusqlite::types::Value::Text("legacy".into()),
            rusqlite::types::Value::Text(lower[1..].to_owned()),
            rusqlite::types::Value::Blob(vec![0; 31]),
            rusqlite::types::Value::Integer(7),
            rusqlite::types::Value::Null,
        ] {
            let got = conn.query_row("SELECT ?1", [&bad], |r| r.get::<_, DecisionId>(0));
            assert!(got.is_err(), "{bad:?}");
        }
        let none: Option<Hash> = conn.query_row("SELECT NULL", [], |r| r.get(0)).unwrap();
        assert_eq!(none, None);
    }

    #[cfg(feature = "postgres")]
    #[test]
    fn postgres_text_round_trips_as_lowercase_hex() {
        let written = id("b");
        let mut out = BytesMut::new();
        assert!(<DecisionId as pg::ToSql>::accepts(&Type::TEXT));
        assert!(!<DecisionId as pg::ToSql>::accepts(&Type::BYTEA));
        pg::ToSql::to_sql(&written, &Type::TEXT, &mut out).unwrap();
        assert_eq!(&out[..], written.to_string().as_bytes());
        let back: DecisionId = pg::FromSql::from_sql(&Type::TEXT, &out).unwrap();
        assert_eq!(back, written);
        let fingerprint: Hash = pg::FromSql::from_sql(&Type::TEXT, &out).unwrap();
        assert_eq!(fingerprint.to_hex(), written.to_string());
        for bad in [&b"d1"[..], &out[1..], b"not hex at all"] {
            assert!(<DecisionId as pg::FromSql>::from_sql(&Type::TEXT, bad).is_err());
        }
    }
}
