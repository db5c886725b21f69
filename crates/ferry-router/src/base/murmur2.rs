//! The Java client's key partitioner: `toPositive(murmur2(key)) % numPartitions`.
//!
//! Kafka's Java producer (`BuiltInPartitioner.partitionForKey`) and Kafka Streams place a keyed
//! record with Kafka's own murmur2 variant (seed `0x9747b28c`, `Utils.murmur2`), then clear the sign
//! bit (`Utils.toPositive`). librdkafka's default partitioner is `consistent_random` (CRC32), which
//! would put an aggregate's events on different partitions than a Java producer does; Ferry computes
//! the Java partition itself, or asks librdkafka for `murmur2_random`, which is the same function.

/// Kafka's murmur2 of `data` (`org.apache.kafka.common.utils.Utils.murmur2`), as a signed 32-bit value.
pub fn murmur2(data: &[u8]) -> i32 {
    const SEED: u32 = 0x9747_b28c;
    const M: u32 = 0x5bd1_e995;
    const R: u32 = 24;

    // Java computes in wrapping 32-bit ints; the length is an int, so truncation matches it.
    let mut h: u32 = SEED ^ (data.len() as u32);
    let mut chunks = data.chunks_exact(4);
    for c in &mut chunks {
        let mut k = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        k = k.wrapping_mul(M);
        k ^= k >> R;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M);
        h ^= k;
    }
    let tail = chunks.remainder();
    if tail.len() >= 3 {
        h ^= u32::from(tail[2]) << 16;
    }
    if tail.len() >= 2 {
        h ^= u32::from(tail[1]) << 8;
    }
    if !tail.is_empty() {
        h ^= u32::from(tail[0]);
        h = h.wrapping_mul(M);
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^= h >> 15;
    h as i32
}

/// Kafka's `Utils.toPositive`: clears the sign bit (not `abs`, which overflows on `i32::MIN`).
#[inline]
pub fn to_positive(n: i32) -> i32 {
    n & 0x7fff_ffff
}

/// The partition the Java producer picks for `key` among `num_partitions` partitions.
///
/// # Panics
/// If `num_partitions <= 0` (a topic always has at least one partition; the caller knows it).
pub fn java_partition(key: &[u8], num_partitions: i32) -> i32 {
    assert!(
        num_partitions > 0,
        "num_partitions must be positive, got {num_partitions}"
    );
    to_positive(murmur2(key)) % num_partitions
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `UtilsTest.testMurmur2` in Apache Kafka's clients module
    /// (`clients/src/test/java/org/apache/kafka/common/utils/UtilsTest.java`).
    const KAFKA_UTILS_TEST: &[(&[u8], i32)] = &[
        (b"21", -973932308),
        (b"foobar", -790332482),
        (b"a-little-bit-long-string", -985981536),
        (b"a-little-bit-longer-string", -1486304829),
        (
            b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8",
            -58897971,
        ),
        (b"abc", 479470107),
    ];

    /// `unittest_murmur2` in librdkafka's `src/rdmurmur2.c`, labelled `java_murmur2_results`
    /// (computed with the Java client), covering every tail length and the empty key.
    const LIBRDKAFKA_JAVA_RESULTS: &[(&[u8], u32)] = &[
        (b"kafka", 0xd067cf64),
        (b"giberish123456789", 0x8f552b0c),
        (b"1234", 0x9fc97b14),
        (b"234", 0xe7c009ca),
        (b"34", 0x873930da),
        (b"4", 0x5a4b5ca1),
        (b"PreAmbleWillBeRemoved,ThePrePartThatIs", 0x78424f1c),
        (b"reAmbleWillBeRemoved,ThePrePartThatIs", 0x4a62b377),
        (b"eAmbleWillBeRemoved,ThePrePartThatIs", 0xe0e4e09e),
        (b"AmbleWillBeRemoved,ThePrePartThatIs", 0x62b8b43f),
        (b"", 0x106e08d9),
    ];

    /// librdkafka `tests/0048-partitioner.c`: positive hashes printed by its Java `Murmur2Cli`
    /// (`toPositive(Utils.murmur2(key))`); the test expects `hash % partition_cnt` for 7 and 17.
    const LIBRDKAFKA_0048_POSITIVE: &[(&[u8], i32)] = &[
        (b"", 0x106e08d9),
        (b"23456", 0x058d780f),
        (
            b"this is another string with more length to it perhaps",
            0x4f7703da,
        ),
        (b"hejsan", 0x5ec19395),
    ];

    #[test]
    fn murmur2_matches_kafka_utils_test() {
        for (key, want) in KAFKA_UTILS_TEST {
            assert_eq!(murmur2(key), *want, "{:?}", String::from_utf8_lossy(key));
        }
    }

    #[test]
    fn murmur2_matches_librdkafka_java_results() {
        for (key, want) in LIBRDKAFKA_JAVA_RESULTS {
            assert_eq!(
                murmur2(key) as u32,
                *want,
                "{:?}",
                String::from_utf8_lossy(key)
            );
        }
    }

    #[test]
    fn java_partition_matches_published_partitions() {
        for (key, positive) in LIBRDKAFKA_0048_POSITIVE {
            assert_eq!(to_positive(murmur2(key)), *positive);
            for n in [1, 7, 17, 100] {
                assert_eq!(java_partition(key, n), positive % n, "{key:?} % {n}");
            }
        }
        // Spelled out, so a reader can compare with a Java producer by hand.
        let table: &[(&[u8], i32, i32)] = &[
            (b"23456", 7, 0x058d780f % 7),
            (b"hejsan", 17, 0x5ec19395 % 17),
            (b"21", 100, (-973932308i32 & 0x7fffffff) % 100),
            (b"foobar", 3, (-790332482i32 & 0x7fffffff) % 3),
        ];
        for (key, n, want) in table {
            assert_eq!(java_partition(key, *n), *want);
        }
        assert_eq!(java_partition(b"21", 100), 40);
        assert_eq!(java_partition(b"foobar", 3), 0);
        assert_eq!(java_partition(b"hejsan", 17), 5);
        assert_eq!(java_partition(b"23456", 7), 5);
    }

    #[test]
    fn to_positive_is_not_abs() {
        assert_eq!(to_positive(i32::MIN), 0);
        assert_eq!(to_positive(-1), i32::MAX);
        assert_eq!(to_positive(5), 5);
    }

    #[test]
    #[should_panic(expected = "num_partitions must be positive")]
    fn zero_partitions_is_a_caller_bug() {
        java_partition(b"k", 0);
    }
}
