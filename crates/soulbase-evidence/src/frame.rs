//! The spool's on-disk framing: `[len: u32 LE][crc32c: u32 LE][payload]`.
//!
//! A torn write (the process died mid-append) leaves a short or mismatching frame at
//! the tail; readers stop there and recovery truncates it. Segments are extended
//! with zeros ahead of the data (so an fsync rarely has to journal a size change):
//! a zero length marks the end of the data.

/// Bytes of a frame header.
pub const HEADER: usize = 8;
/// Largest payload accepted (a record is a few hundred bytes; this only bounds garbage).
pub const MAX_PAYLOAD: usize = 16 << 20;

/// CRC-32C, slice-by-16, where the processor has no CRC-32C instruction: every
/// record is checksummed once when spooled and once when drained, and the
/// byte-at-a-time table cost a few per cent of a loaded server's CPU.
const CRC: crc::Crc<u32, crc::Table<16>> = crc::Crc::<u32, crc::Table<16>>::new(&crc::CRC_32_ISCSI);

/// The CRC-32C of `bytes` (frames, and the drain checkpoint): the processor's
/// `crc32` instruction on x86-64 with SSE 4.2 (eight bytes an instruction; the
/// tables took ~9,000 instructions per governed call), else the tables.
pub fn checksum(bytes: &[u8]) -> u32 {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("sse4.2") {
        // SAFETY: the processor has SSE 4.2, the only feature `crc32c_sse42` is
        // compiled to use.
        #[allow(unsafe_code)]
        return unsafe { crc32c_sse42(bytes) };
    }
    CRC.checksum(bytes)
}

/// CRC-32C with SSE 4.2's `crc32` instruction: eight bytes at a time, then the
/// tail byte by byte (the instruction applies the reflected Castagnoli polynomial,
/// so the result equals the tables').
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "sse4.2")]
fn crc32c_sse42(bytes: &[u8]) -> u32 {
    use std::arch::x86_64::{_mm_crc32_u8, _mm_crc32_u64};
    let (words, tail) = bytes.as_chunks::<8>();
    let mut crc = u64::from(u32::MAX);
    for word in words {
        crc = _mm_crc32_u64(crc, u64::from_le_bytes(*word));
    }
    // The instruction leaves the upper half zero.
    let mut crc = crc as u32;
    for &b in tail {
        crc = _mm_crc32_u8(crc, b);
    }
    !crc
}

/// Appends one frame holding `payload` to `out` (tests' frames of given bytes).
#[cfg(test)]
pub(crate) fn encode_into(payload: &[u8], out: &mut Vec<u8>) {
    let written = encode_with(out, |out| {
        out.extend_from_slice(payload);
        Ok::<(), std::convert::Infallible>(())
    });
    let Ok(()) = written;
}

/// Appends one frame to `out` whose payload `write` appends: written in place,
/// its header filled in after (no copy of the payload).
pub fn encode_with<E>(
    out: &mut Vec<u8>,
    write: impl FnOnce(&mut Vec<u8>) -> Result<(), E>,
) -> Result<(), E> {
    let start = out.len();
    out.extend_from_slice(&[0; HEADER]);
    if let Err(e) = write(out) {
        out.truncate(start);
        return Err(e);
    }
    let payload = &out[start + HEADER..];
    let len = u32::try_from(payload.len()).unwrap_or(u32::MAX);
    let crc = checksum(payload);
    out[start..start + 4].copy_from_slice(&len.to_le_bytes());
    out[start + 4..start + HEADER].copy_from_slice(&crc.to_le_bytes());
    Ok(())
}

/// What is at the start of `buf`.
#[derive(Debug, PartialEq, Eq)]
pub enum Decoded<'a> {
    /// A whole, intact frame and its total length.
    Frame(&'a [u8], usize),
    /// Not enough bytes for a whole frame (a torn tail, or end of data).
    Incomplete,
    /// A zero length: the preallocated space after the data.
    End,
    /// A frame whose checksum or length is wrong.
    Corrupt,
}

/// Decodes the frame at the start of `buf`.
pub fn decode(buf: &[u8]) -> Decoded<'_> {
    let Some((head, rest)) = buf.split_at_checked(HEADER) else {
        return Decoded::Incomplete;
    };
    let len = u32::from_le_bytes([head[0], head[1], head[2], head[3]]) as usize;
    let crc = u32::from_le_bytes([head[4], head[5], head[6], head[7]]);
    if len == 0 {
        return Decoded::End;
    }
    if len > MAX_PAYLOAD {
        return Decoded::Corrupt;
    }
    let Some(payload) = rest.get(..len) else {
        return Decoded::Incomplete;
    };
    if checksum(payload) != crc {
        return Decoded::Corrupt;
    }
    Decoded::Frame(payload, HEADER + len)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_checksum_is_crc32c() {
        // The standard check value: spools written by any build stay readable.
        assert_eq!(CRC.checksum(b"123456789"), 0xE306_9283);
        assert_eq!(checksum(b"123456789"), 0xE306_9283);
    }

    #[test]
    fn the_instruction_and_the_tables_agree() {
        // Every tail length and start offset, on bytes that are not all alike.
        let bytes: Vec<u8> = (0..300u32).map(|i| (i * 131 + 7) as u8).collect();
        for start in 0..9 {
            for end in start..bytes.len() {
                let s = &bytes[start..end];
                assert_eq!(checksum(s), CRC.checksum(s), "bytes {start}..{end}");
            }
        }
    }

    #[test]
    fn round_trip_torn_and_corrupt() {
        let mut buf = Vec::new();
        encode_into(b"hello", &mut buf);
        encode_into(b"world!", &mut buf);
        let Decoded::Frame(p, n) = decode(&buf) else {
            panic!("no frame")
        };
        assert_eq!((p, n), (&b"hello"[..], HEADER + 5));
        // The header in front of the payload.
        let mut built = Vec::new();
        encode_into(b"hello", &mut built);
        assert_eq!(built[..4], 5u32.to_le_bytes());
        assert_eq!(built[4..HEADER], checksum(b"hello").to_le_bytes());
        assert_eq!(built[HEADER..], *b"hello");
        // A failed payload leaves nothing behind.
        assert_eq!(
            encode_with(&mut built, |out| {
                out.push(b'x');
                Err(())
            }),
            Err(())
        );
        assert_eq!(built, buf[..n]);
        assert_eq!(decode(&buf[n..]), Decoded::Frame(b"world!", HEADER + 6));
        assert_eq!(decode(&buf[n..buf.len() - 1]), Decoded::Incomplete);
        assert_eq!(decode(&buf[..3]), Decoded::Incomplete);
        let mut bad = buf.clone();
        bad[HEADER] ^= 1;
        assert_eq!(decode(&bad), Decoded::Corrupt);
        assert_eq!(decode(&[0u8; 64]), Decoded::End);
        let mut huge = vec![0xff; 16];
        huge[4] = 0;
        assert_eq!(decode(&huge), Decoded::Corrupt);
    }
}
