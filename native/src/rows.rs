//! Stored rows as msgspec writes them: `crc32(body)` big-endian, then a msgpack array of the
//! value's fields in declaration order (`storage/codec.py`).
//!
//! A row is split into its fields' byte spans, a few fields are replaced, and the row is
//! written again with every other field's bytes copied as they were. That is byte for byte
//! what msgspec writes for the same value only if the copied bytes are in msgspec's form, the
//! smallest one for every integer, string, array and map; so the reader accepts nothing else
//! and anything it does not accept is `None`, which sends the record to the Python kernel.
//! The reader never guesses: an unknown marker, a non-smallest form or a truncated value is
//! `None`, not an error, because deciding what a damaged row means is the reference's job
//! (it names the table and key in its refusal).

/// Why a row could not be taken: the caller falls back to the reference either way.
pub type Parsed<T> = Option<T>;

/// The body of a framed value whose checksum holds.
pub fn unframe(data: &[u8]) -> Parsed<&[u8]> {
    if data.len() < 4 || crc32fast::hash(&data[4..]).to_be_bytes() != data[..4] {
        return None;
    }
    Some(&data[4..])
}

/// A buffer for a framed value: room for the checksum, then the body is appended.
pub fn begin(capacity: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(capacity + 4);
    out.extend_from_slice(&[0; 4]);
    out
}

/// The buffer `begin` started, its checksum filled in: what `frame(body)` gives.
pub fn seal(mut out: Vec<u8>) -> Vec<u8> {
    let crc = crc32fast::hash(&out[4..]).to_be_bytes();
    out[..4].copy_from_slice(&crc);
    out
}

/// `crc32(body)` big-endian, then `body`.
pub fn frame(body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(body.len() + 4);
    out.extend_from_slice(&crc32fast::hash(body).to_be_bytes());
    out.extend_from_slice(body);
    out
}

struct Reader<'a> {
    data: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Parsed<&'a [u8]> {
        let end = self.at.checked_add(n)?;
        let out = self.data.get(self.at..end)?;
        self.at = end;
        Some(out)
    }

    fn byte(&mut self) -> Parsed<u8> {
        Some(self.take(1)?[0])
    }

    fn uint(&mut self, width: usize) -> Parsed<u64> {
        Some(
            self.take(width)?
                .iter()
                .fold(0u64, |acc, b| (acc << 8) | u64::from(*b)),
        )
    }

    /// A length in `width` bytes that the smaller forms could not have held.
    fn length(&mut self, width: usize, smallest_above: u64) -> Parsed<usize> {
        let n = self.uint(width)?;
        if n <= smallest_above {
            return None;
        }
        usize::try_from(n).ok()
    }

    /// Skip one value, checking that it is in msgspec's form.
    fn skip(&mut self, depth: u32) -> Parsed<()> {
        if depth > 8 {
            return None; // no row nests this deep
        }
        let marker = self.byte()?;
        match marker {
            0x00..=0x7f | 0xe0..=0xff | 0xc0 | 0xc2 | 0xc3 => Some(()),
            0x80..=0x8f => self.skip_items(usize::from(marker & 0x0f) * 2, depth),
            0x90..=0x9f => self.skip_items(usize::from(marker & 0x0f), depth),
            0xa0..=0xbf => self.take(usize::from(marker & 0x1f)).map(|_| ()),
            0xd9 => {
                let n = self.length(1, 31)?;
                self.utf8(n)
            }
            0xda => {
                let n = self.length(2, 0xff)?;
                self.utf8(n)
            }
            0xdb => {
                let n = self.length(4, 0xffff)?;
                self.utf8(n)
            }
            0xc4 => {
                let n = self.uint(1)? as usize;
                self.take(n).map(|_| ())
            }
            0xc5 => {
                let n = self.length(2, 0xff)?;
                self.take(n).map(|_| ())
            }
            0xc6 => {
                let n = self.length(4, 0xffff)?;
                self.take(n).map(|_| ())
            }
            0xdc => {
                let n = self.length(2, 15)?;
                self.skip_items(n, depth)
            }
            0xdd => {
                let n = self.length(4, 0xffff)?;
                self.skip_items(n, depth)
            }
            0xde => {
                let n = self.length(2, 15)?;
                self.skip_items(n * 2, depth)
            }
            0xdf => {
                let n = self.length(4, 0xffff)?;
                self.skip_items(n * 2, depth)
            }
            0xcc..=0xd3 => {
                self.at -= 1;
                self.int().map(|_| ())
            }
            _ => None, // floats, extensions: no row holds them
        }
    }

    fn utf8(&mut self, n: usize) -> Parsed<()> {
        std::str::from_utf8(self.take(n)?).ok().map(|_| ())
    }

    fn skip_items(&mut self, n: usize, depth: u32) -> Parsed<()> {
        for _ in 0..n {
            self.skip(depth + 1)?;
        }
        Some(())
    }

    /// An integer in its smallest form (msgspec writes a non-negative one unsigned).
    fn int(&mut self) -> Parsed<i64> {
        let marker = self.byte()?;
        let (value, smallest) = match marker {
            0x00..=0x7f => return Some(i64::from(marker)),
            0xe0..=0xff => return Some(i64::from(marker as i8)),
            0xcc => (i128::from(self.uint(1)?), (128, u64::MAX as i128)),
            0xcd => (i128::from(self.uint(2)?), (0x100, u64::MAX as i128)),
            0xce => (i128::from(self.uint(4)?), (0x1_0000, u64::MAX as i128)),
            0xcf => (i128::from(self.uint(8)?), (0x1_0000_0000, u64::MAX as i128)),
            0xd0 => (i128::from(self.uint(1)? as u8 as i8), (-128, -33)),
            0xd1 => (i128::from(self.uint(2)? as u16 as i16), (-0x8000, -129)),
            0xd2 => (
                i128::from(self.uint(4)? as u32 as i32),
                (-0x8000_0000, -0x8001),
            ),
            0xd3 => (
                i128::from(self.uint(8)? as i64),
                (i64::MIN as i128, -0x8000_0001),
            ),
            _ => return None,
        };
        if value < smallest.0 || value > smallest.1 {
            return None;
        }
        i64::try_from(value).ok()
    }
}

/// A row's fields as byte spans of its body.
pub struct Row<'a> {
    body: &'a [u8],
    spans: Vec<(usize, usize)>,
}

impl<'a> Row<'a> {
    /// The fields of a positional row of at least `min` and at most `max` fields.
    pub fn parse(body: &'a [u8], min: usize, max: usize) -> Parsed<Row<'a>> {
        let mut r = Reader { data: body, at: 0 };
        let marker = r.byte()?;
        let n = match marker {
            0x90..=0x9f => usize::from(marker & 0x0f),
            0xdc => r.length(2, 15)?,
            0xdd => r.length(4, 0xffff)?,
            _ => return None,
        };
        if n < min || n > max {
            return None;
        }
        let mut spans = Vec::with_capacity(max);
        for _ in 0..n {
            let start = r.at;
            r.skip(0)?;
            spans.push((start, r.at));
        }
        if r.at != body.len() {
            return None; // trailing bytes: not a row msgspec wrote
        }
        Some(Row { body, spans })
    }

    pub fn raw(&self, i: usize) -> &'a [u8] {
        let (start, end) = self.spans[i];
        &self.body[start..end]
    }

    pub fn int(&self, i: usize) -> Parsed<i64> {
        let raw = self.raw(i);
        let mut r = Reader { data: raw, at: 0 };
        let value = r.int()?;
        (r.at == raw.len()).then_some(value)
    }

    pub fn str(&self, i: usize) -> Parsed<&'a str> {
        let raw = self.raw(i);
        let (skip, n) = match raw.first()? {
            m @ 0xa0..=0xbf => (1, usize::from(m & 0x1f)),
            0xd9 => (2, usize::from(raw[1])),
            0xda => (3, usize::from(u16::from_be_bytes([raw[1], raw[2]]))),
            0xdb => (
                5,
                u32::from_be_bytes([raw[1], raw[2], raw[3], raw[4]]) as usize,
            ),
            _ => return None,
        };
        (raw.len() == skip + n).then_some(())?;
        std::str::from_utf8(&raw[skip..]).ok()
    }

    pub fn is(&self, i: usize, value: &[u8]) -> bool {
        self.raw(i) == value
    }

    /// The row again, field `i` replaced by the bytes `with` gives for it, padded with nil
    /// up to `fields` (every trailing default of the stored types is None).
    pub fn rewrite(&self, fields: usize, with: &[(usize, Vec<u8>)]) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.body.len() + 64);
        array_header(&mut out, fields);
        for i in 0..fields {
            if let Some((_, bytes)) = with.iter().find(|(at, _)| *at == i) {
                out.extend_from_slice(bytes);
            } else if i < self.spans.len() {
                out.extend_from_slice(self.raw(i));
            } else {
                out.push(NIL);
            }
        }
        out
    }
}

pub const NIL: u8 = 0xc0;
pub const FALSE: u8 = 0xc2;

pub fn array_header(out: &mut Vec<u8>, n: usize) {
    if n <= 15 {
        out.push(0x90 | n as u8);
    } else if n <= 0xffff {
        out.push(0xdc);
        out.extend_from_slice(&(n as u16).to_be_bytes());
    } else {
        out.push(0xdd);
        out.extend_from_slice(&(n as u32).to_be_bytes());
    }
}

/// An integer in the smallest form, as msgspec writes it.
pub fn int(value: i64) -> Vec<u8> {
    let mut out = Vec::with_capacity(9);
    put_int(&mut out, value);
    out
}

/// `int(value)` appended to `out`.
pub fn put_int(out: &mut Vec<u8>, value: i64) {
    if value >= 0 {
        let v = value as u64;
        if v <= 0x7f {
            out.push(v as u8);
        } else if v <= 0xff {
            out.extend_from_slice(&[0xcc, v as u8]);
        } else if v <= 0xffff {
            out.push(0xcd);
            out.extend_from_slice(&(v as u16).to_be_bytes());
        } else if v <= 0xffff_ffff {
            out.push(0xce);
            out.extend_from_slice(&(v as u32).to_be_bytes());
        } else {
            out.push(0xcf);
            out.extend_from_slice(&v.to_be_bytes());
        }
    } else if value >= -32 {
        out.push(value as i8 as u8);
    } else if value >= -0x80 {
        out.extend_from_slice(&[0xd0, value as i8 as u8]);
    } else if value >= -0x8000 {
        out.push(0xd1);
        out.extend_from_slice(&(value as i16).to_be_bytes());
    } else if value >= -0x8000_0000 {
        out.push(0xd2);
        out.extend_from_slice(&(value as i32).to_be_bytes());
    } else {
        out.push(0xd3);
        out.extend_from_slice(&value.to_be_bytes());
    }
}

/// A string in the smallest form, as msgspec writes it.
pub fn str(value: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(value.len() + 5);
    put_str(&mut out, value);
    out
}

/// `str(value)` appended to `out`.
pub fn put_str(out: &mut Vec<u8>, value: &str) {
    let n = value.len();
    if n <= 31 {
        out.push(0xa0 | n as u8);
    } else if n <= 0xff {
        out.extend_from_slice(&[0xd9, n as u8]);
    } else if n <= 0xffff {
        out.push(0xda);
        out.extend_from_slice(&(n as u16).to_be_bytes());
    } else {
        out.push(0xdb);
        out.extend_from_slice(&(n as u32).to_be_bytes());
    }
    out.extend_from_slice(value.as_bytes());
}

/// Whether `bytes` is exactly one value in msgspec's form (a nested map handed in whole).
pub fn is_one_value(bytes: &[u8]) -> bool {
    let mut r = Reader { data: bytes, at: 0 };
    r.skip(0).is_some() && r.at == bytes.len()
}

/// A two-integer row (`PayloadRef`: count, size; `TenantUsage`: live, bytes).
pub fn pair(raw: &[u8]) -> Parsed<(i64, i64)> {
    let row = Row::parse(unframe(raw)?, 2, 2)?;
    Some((row.int(0)?, row.int(1)?))
}

/// The framed row of a two-integer value.
pub fn pair_row(a: i64, b: i64) -> Vec<u8> {
    let mut out = begin(19);
    out.push(0x92);
    put_int(&mut out, a);
    put_int(&mut out, b);
    seal(out)
}
