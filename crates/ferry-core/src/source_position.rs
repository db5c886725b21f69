//! Placeholder until the position-header branch lands: only what the inbox machine needs.

use ferry_pgtypes::Lsn;

pub const SOURCE_HEADER: &str = "ferry-source";
pub const POSITION_HEADER: &str = "ferry-position";

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SourcePosition {
    pub commit_lsn: Lsn,
    pub index: u32,
}

impl SourcePosition {
    pub fn parse(value: &[u8]) -> Option<SourcePosition> {
        let s = std::str::from_utf8(value).ok()?;
        let (lsn, index) = s.rsplit_once(':')?;
        Some(SourcePosition {
            commit_lsn: lsn.parse().ok()?,
            index: index.parse().ok()?,
        })
    }
}
