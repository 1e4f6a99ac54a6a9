//! Protobuf's wire format, read: the fields of one message (a key, then a varint, a length
//! and its bytes, or a fixed width), each read bounded by the bytes there are, and an error
//! that names the field's path in the answer and its byte offset. What the fields mean is
//! [`super::proto`]'s.

/// Why an answer could not be decoded: where (the field's path and the byte offset in the
/// message) and what was wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("ListPodResourcesResponse: {path} at byte {offset}: {what}")]
pub(crate) struct DecodeError {
    /// `pod_resources[2].containers[0].name`, or the message when no field is known yet.
    pub path: String,
    pub offset: usize,
    pub what: String,
}

/// A field's name as an error gives it; made into text only for an error (an answer holds
/// millions of fields).
#[derive(Debug, Clone, Copy)]
pub(super) enum Name {
    /// The message itself.
    None,
    /// `name`.
    Plain(&'static str),
    /// `containers[3]`.
    Item(&'static str, usize),
    /// `field 9`: a field this decoder does not read.
    Number(u64),
}

impl std::fmt::Display for Name {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Name::None => Ok(()),
            Name::Plain(n) => f.write_str(n),
            Name::Item(n, i) => write!(f, "{n}[{i}]"),
            Name::Number(n) => write!(f, "field {n}"),
        }
    }
}

/// Where a message is in the answer: its field and the message that holds it.
#[derive(Debug, Clone, Copy)]
pub(super) struct Place<'p> {
    pub(super) up: Option<&'p Place<'p>>,
    pub(super) name: Name,
}

impl std::fmt::Display for Place<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if let Some(up) = self.up {
            write!(f, "{up}.")?;
        }
        write!(f, "{}", self.name)
    }
}

/// Protobuf's wire types (the low three bits of a field's key).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum WireType {
    Varint,
    Fixed64,
    Len,
    Fixed32,
}

/// A field's key, read at `offset`.
pub(super) struct Field {
    pub(super) number: u64,
    wire: WireType,
    offset: usize,
}

/// Reads the fields of one message: `bytes` is the message, `base` its offset in the whole
/// answer (for errors), `place` its place in the answer (`None`: the answer itself).
pub(super) struct Reader<'a, 'p> {
    bytes: &'a [u8],
    pos: usize,
    base: usize,
    place: Option<Place<'p>>,
}

impl<'a, 'p> Reader<'a, 'p> {
    pub(super) fn new(bytes: &'a [u8], base: usize, place: Option<Place<'p>>) -> Reader<'a, 'p> {
        Reader {
            bytes,
            pos: 0,
            base,
            place,
        }
    }

    fn error(&self, field: Name, at: usize, what: impl Into<String>) -> DecodeError {
        let path = match (self.place, field) {
            (None, Name::None) => "the message".to_owned(),
            (Some(p), Name::None) => p.to_string(),
            (None, field) => field.to_string(),
            (Some(p), field) => format!("{p}.{field}"),
        };
        DecodeError {
            path,
            offset: self.base + at,
            what: what.into(),
        }
    }

    /// The next field's key, or `None` at the end of the message.
    pub(super) fn field(&mut self) -> Result<Option<Field>, DecodeError> {
        if self.pos == self.bytes.len() {
            return Ok(None);
        }
        let offset = self.pos;
        let key = self.varint(Name::None)?;
        let number = key >> 3;
        let wire = match key & 7 {
            0 => WireType::Varint,
            1 => WireType::Fixed64,
            2 => WireType::Len,
            5 => WireType::Fixed32,
            // 3 and 4 are proto2's groups, which no field of this API uses.
            w => {
                return Err(self.error(
                    Name::None,
                    offset,
                    format!("field key {key} has wire type {w}, which this API never uses"),
                ));
            }
        };
        if number == 0 {
            return Err(self.error(Name::None, offset, "field number 0 is not a field"));
        }
        Ok(Some(Field {
            number,
            wire,
            offset,
        }))
    }

    fn varint(&mut self, field: Name) -> Result<u64, DecodeError> {
        let start = self.pos;
        let mut v: u64 = 0;
        for shift in (0..64).step_by(7) {
            let Some(&b) = self.bytes.get(self.pos) else {
                return Err(self.error(field, start, "the message ends inside a varint"));
            };
            self.pos += 1;
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(self.error(field, start, "a varint longer than 10 bytes"))
    }

    /// The next `n` bytes, and their offset in this message.
    fn take(&mut self, n: u64, field: Name, at: usize) -> Result<(&'a [u8], usize), DecodeError> {
        let left = self.bytes.len() - self.pos;
        let n = usize::try_from(n)
            .ok()
            .filter(|&n| n <= left)
            .ok_or_else(|| {
                self.error(
                    field,
                    at,
                    format!("a length of {n} bytes, past the {left} left"),
                )
            })?;
        let start = self.pos;
        self.pos += n;
        Ok((&self.bytes[start..start + n], start))
    }

    /// A length-delimited field's bytes, and their offset in the whole answer.
    pub(super) fn len_field(
        &mut self,
        f: &Field,
        field: Name,
    ) -> Result<(&'a [u8], usize), DecodeError> {
        if f.wire != WireType::Len {
            return Err(self.error(
                field,
                f.offset,
                format!("wire type {:?}, not length-delimited", f.wire),
            ));
        }
        let n = self.varint(field)?;
        let (b, at) = self.take(n, field, f.offset)?;
        Ok((b, self.base + at))
    }

    /// A string field of at most `max` bytes, not copied; `None` when longer (it must
    /// still be UTF-8).
    pub(super) fn bounded_string(
        &mut self,
        f: &Field,
        field: Name,
        max: usize,
    ) -> Result<Option<&'a str>, DecodeError> {
        let (b, _) = self.len_field(f, field)?;
        let s = std::str::from_utf8(b).map_err(|e| {
            self.error(
                field,
                f.offset,
                format!("not UTF-8 (at byte {} of the string)", e.valid_up_to()),
            )
        })?;
        Ok((s.len() <= max).then_some(s))
    }

    /// Skips a field this decoder does not read.
    pub(super) fn skip(&mut self, f: &Field) -> Result<(), DecodeError> {
        let name = Name::Number(f.number);
        match f.wire {
            WireType::Varint => self.varint(name).map(|_| ()),
            WireType::Fixed64 => self.take(8, name, f.offset).map(|_| ()),
            WireType::Fixed32 => self.take(4, name, f.offset).map(|_| ()),
            WireType::Len => {
                let n = self.varint(name)?;
                self.take(n, name, f.offset).map(|_| ())
            }
        }
    }
}
