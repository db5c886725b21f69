//! A column value where it is held: a range of the buffer it arrived in. The reader decodes a
//! tuple into ranges of its message, and the router reads them in place and slices out only
//! what a record keeps (the key, the payload, a header), without a copy or a reference count
//! per column.

use bytes::Bytes;

/// A value's bytes: a range of the buffer that holds them. Two values are equal when their
/// bytes are, wherever they are held.
#[derive(Clone, Copy)]
pub struct Value<'a> {
    within: &'a Bytes,
    start: usize,
    end: usize,
}

impl<'a> Value<'a> {
    /// The bytes at `range` of `within`. Made for every column the router reads, so the range is
    /// checked here only in debug builds; reading a range that is not within `within` panics.
    #[inline]
    pub fn new(within: &'a Bytes, range: std::ops::Range<usize>) -> Self {
        debug_assert!(
            range.start <= range.end && range.end <= within.len(),
            "a value's range {range:?} outside its buffer of {} bytes",
            within.len()
        );
        Value {
            within,
            start: range.start,
            end: range.end,
        }
    }

    /// The value's bytes.
    #[inline]
    pub fn as_slice(&self) -> &'a [u8] {
        &self.within[self.start..self.end]
    }

    /// The value as an owned slice of its buffer (no copy).
    #[inline]
    pub fn to_bytes(&self) -> Bytes {
        self.within.slice(self.start..self.end)
    }

    /// The value without its first `skip` bytes (none if it is shorter), as an owned slice of
    /// its buffer (no copy).
    #[inline]
    pub fn tail(&self, skip: usize) -> Bytes {
        self.within
            .slice((self.start + skip).min(self.end)..self.end)
    }
}

/// The whole of `bytes`.
impl<'a> From<&'a Bytes> for Value<'a> {
    #[inline]
    fn from(bytes: &'a Bytes) -> Self {
        Value {
            within: bytes,
            start: 0,
            end: bytes.len(),
        }
    }
}

impl std::ops::Deref for Value<'_> {
    type Target = [u8];

    #[inline]
    fn deref(&self) -> &[u8] {
        self.as_slice()
    }
}

impl AsRef<[u8]> for Value<'_> {
    #[inline]
    fn as_ref(&self) -> &[u8] {
        self.as_slice()
    }
}

impl PartialEq for Value<'_> {
    fn eq(&self, other: &Self) -> bool {
        self.as_slice() == other.as_slice()
    }
}

impl Eq for Value<'_> {}

impl std::fmt::Debug for Value<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // As `Bytes` prints (b"..."), from a slice of the buffer: no copy.
        std::fmt::Debug::fmt(&self.to_bytes(), f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_value_is_its_range_of_the_buffer_and_slices_it_without_a_copy() {
        let buf = Bytes::from_static(b"\x01{\"a\": 1}rest");
        let v = Value::new(&buf, 0..9);
        assert_eq!(v.as_slice(), b"\x01{\"a\": 1}");
        assert_eq!(v.to_bytes().as_ptr(), buf.as_ptr());
        assert_eq!(v.tail(1), Bytes::from_static(b"{\"a\": 1}"));
        assert!(v.tail(20).is_empty());
        assert_eq!(v, Value::from(&Bytes::from_static(b"\x01{\"a\": 1}")));
        assert_eq!(format!("{v:?}"), format!("{:?}", v.to_bytes()));
    }

    #[test]
    #[should_panic]
    fn a_range_past_the_buffer_is_refused() {
        let buf = Bytes::from_static(b"abc");
        let _ = Value::new(&buf, 1..4).to_bytes();
    }
}
