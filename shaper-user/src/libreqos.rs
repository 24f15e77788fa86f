//! Reading LibreQoS's `ShapedDevices.csv` into circuits, the unit LibreQoS shapes and
//! shaper's subscriber: [`read`] returns each circuit's id, name, prefixes and rates, or
//! one error naming the line, the column and the bad value.
//!
//! # The format, as LibreQoS writes and reads it
//!
//! Learned from the LibreQoE/LibreQoS repository at commit `455bc13b` (2026-08-18):
//! `src/ShapedDevices.example.csv` (and its earlier versions, `4030d811` having the
//! comment lines, the `sqm` column and a circuit of two devices), the Rust loader
//! `src/rust/lqos_config/src/shaped_devices/{mod.rs,shaped_device.rs}` (what `lqosd`
//! runs on), the Python side `src/LibreQoS.py` (`validateNetworkAndDevices()` and
//! `loadSubscriberCircuits()`, which build the queues) and the web editor's validation
//! `src/rust/lqosd/src/node_manager/local_api/config.rs` (`validate_shaped_devices()`).
//!
//! * **One row per device.** The first row that is not a comment names the columns:
//!   `Circuit ID, Circuit Name, Device ID, Device Name, Parent Node, MAC, IPv4, IPv6,
//!   Download Min Mbps, Upload Min Mbps, Download Max Mbps, Upload Max Mbps, Comment`,
//!   newer files with `Parent Node ID` and `Anchor Node ID` after `Parent Node` and an
//!   optional `sqm` last. Both readers find columns by header name, compared lowercased
//!   with everything but letters and digits removed (`Download Min` and
//!   `download_min_mbps` are `Download Min Mbps` too), and ignore headers they do not
//!   know; a known column whose header is missing falls back, there, to its position in
//!   the 13-column layout.
//! * **Comments.** A line starting with `#` is skipped (the Rust loader's csv reader has
//!   `comment(b'#')`; Python skips a row whose first cell starts with `#`), anywhere, the
//!   header's place included. Empty lines are skipped.
//! * **Cells.** Standard CSV quoting; the Rust loader trims every cell
//!   (`Trim::All`) and accepts rows with fewer or more cells than the header
//!   (`flexible(true)`): a missing cell reads as empty. It strips a byte-order mark and
//!   decodes UTF-16 and, failing UTF-8, guesses among Windows and ISO code pages.
//! * **Circuits.** Rows with one `Circuit ID` are one circuit, wherever they are in the
//!   file. An empty `Circuit ID` is refused (Python: "Missing circuitID is unsupported").
//!   The circuit takes its name, `Parent Node` and rates from its **first** row: a later
//!   row with other rates is warned about and ignored, another name is ignored silently
//!   (the Rust struct's comment: "circuit names must match"), another `Parent Node` is an
//!   error.
//! * **Addresses.** `IPv4` and `IPv6` each hold a comma-separated list (so quoted when it
//!   has more than one) of addresses or CIDR prefixes; spaces are removed; a bare address
//!   is a /32 or /128. Python's validation (`ipaddress.ip_network`, strict) refuses a
//!   prefix with host bits set; the Rust loader drops a bad entry silently, and its
//!   lookup trie drops a prefix with host bits set silently. The same address string
//!   twice in the file fails validation for IPv6 and is only warned about for IPv4; the
//!   trie keeps the last device's.
//! * **Rates** are megabits per second (10⁶ bit/s: they become tc `mbit`, not tc's
//!   megabyte `mbps`), decimals accepted since v1.5, parsed as `f32` (Python `float`):
//!   validation wants Min ≥ 0.1, Max ≥ 0.2 and Min ≤ Max; the loader only refuses below
//!   0.01. Min becomes the HTB class's `rate` (what is guaranteed under contention) and
//!   Max its `ceil`, printed with one decimal (`10.55` becomes `10.6mbit`).
//! * Ignored for shaping here: `Device ID`, `Device Name`, `Parent Node` (and its ids),
//!   `MAC` (also a RADIUS user name), `Comment`, `sqm` (LibreQoS's qdisc per circuit,
//!   `cake`, `fq_codel`, `none` or `down/up`).
//! * The example file at `455bc13b` has a 15-name header over 13-cell rows, so by header
//!   name its `IPv4` cells read `1`: LibreQoS's own loader refuses it, and so does this one.
//!
//! # What this reader accepts, and why it differs
//!
//! Everything LibreQoS needs to shape, read exactly or refused; nothing dropped silently:
//!
//! * Columns by header name as LibreQoS compares them (the same aliases). Required:
//!   `Circuit ID`, `IPv4`, `IPv6` and the four rates; `Circuit Name` is read if present.
//!   Other columns are ignored, known or not: LibreQoS adds columns between versions
//!   (`Parent Node ID`, `Anchor Node ID`, `sqm`) and integrations add their own, so
//!   refusing them would refuse the files of newer LibreQoS releases for no gain. There is
//!   no fallback to positions: a required column missing by name is an error, and a
//!   column the reader uses that appears twice is refused as ambiguous.
//! * Rows shorter or longer than the header, as LibreQoS: a missing cell is empty; cells
//!   past the header are ignored (an unquoted comma in `Comment` makes one).
//! * A UTF-8 byte-order mark is skipped; UTF-16 is refused with the `iconv` to run, and a
//!   `Circuit ID` or `Circuit Name` that is not UTF-8 is refused (ignored columns may
//!   hold anything). Guessing a code page, as LibreQoS does, can change a name silently.
//! * A line break inside any cell is refused: LibreQoS's writers never produce one, and
//!   an unclosed quote would otherwise swallow every following row into one cell,
//!   dropping those circuits without a word.
//! * Rates are parsed from their decimal digits into exact bit/s: `2.5` is 2,500,000.
//!   Refused, with the reason: more than six decimals that are not zeros (finer than one
//!   bit/s), signs, exponents, `nan`/`inf`, a decimal comma, zero, and rates outside what
//!   shaper's buckets take (8 bit/s to 100 Tbit/s). Min above Max is refused as
//!   LibreQoS's validation does; its 0.1 and 0.2 Mbps floors are not kept (they are HTB
//!   quantum workarounds).
//! * Rows of one circuit must agree on `Circuit Name` and the four rates, or the file is
//!   refused at the row that differs: LibreQoS keeps the first row's and warns, but an
//!   importer that picks one of two plans silently bills the customer for the wrong one.
//! * A prefix with host bits set is refused, as `ip route` and LibreQoS's validation do.
//!   An IPv4 address in the `IPv6` column (IPv4-mapped ones included) or the reverse is
//!   refused. The same prefix in two circuits is refused (whose bucket would it be?); the
//!   same prefix twice in one circuit (two devices listing it) is kept once. Nested
//!   prefixes of different circuits are not judged here: where one subscriber's prefix
//!   may sit inside another's is the subscriber table's rule.
//! * A circuit with no address in any of its rows is refused: it would shape nothing.
//! * Bounds, so that a hostile file cannot exhaust memory: [`MAX_FILE_BYTES`],
//!   [`MAX_ROWS`], [`MAX_PREFIXES`], [`MAX_ROW_BYTES`], [`MAX_ID_BYTES`],
//!   [`MAX_NAME_BYTES`]. Control characters in ids and names are refused (they would break
//!   one-line output).
//!
//! Both Min and Max are returned ([`Rates`]); which the caller shapes to is its choice
//! (`docs/operating/migrating-from-libreqos.md` argues the default: Max).
//!
//! Errors are one line, `line N, column "HEADER": reason naming 'the value'`; the caller
//! puts the file's name in front: `ShapedDevices.csv line 7, column "IPv4": invalid
//! address '10.0.0.300'`. The column is the header as the file writes it.

use std::{
    collections::hash_map::Entry,
    hash::BuildHasher as _,
    io::{self, Read},
    net::IpAddr,
};

use csv::{ByteRecord, ReaderBuilder};
use foldhash::HashMap;
use ipnet::IpNet;
use shaper_common::gcra::{MAX_RATE_BPS, MIN_RATE_BPS};

/// The largest file read: 512 MiB, over four million rows of LibreQoS's example's size.
pub const MAX_FILE_BYTES: u64 = 512 << 20;
/// Most device rows (after the header, comments not counted).
pub const MAX_ROWS: usize = 1 << 22;
/// Most prefixes in the file, all circuits together.
pub const MAX_PREFIXES: usize = 1 << 22;
/// Longest row, in bytes (a cell of over 3,000 addresses fits).
pub const MAX_ROW_BYTES: usize = 64 << 10;
/// Longest `Circuit ID`, in bytes (integrations write numbers or 36-character UUIDs).
pub const MAX_ID_BYTES: usize = 64;
/// Longest `Circuit Name`, in bytes.
pub const MAX_NAME_BYTES: usize = 256;

/// One circuit: the rows that share a `Circuit ID`, merged.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Circuit {
    /// `Circuit ID`, trimmed, never empty.
    pub id: String,
    /// `Circuit Name`, if the column exists and the cell is not empty.
    pub name: Option<String>,
    /// Every row's `IPv4` then `IPv6` entries, in file order, each once; a bare address
    /// is a /32 or /128.
    pub prefixes: Vec<IpNet>,
    /// `Download Min Mbps` and `Download Max Mbps`: toward the customer.
    pub download: Rates,
    /// `Upload Min Mbps` and `Upload Max Mbps`: from the customer.
    pub upload: Rates,
    /// The line of the circuit's first row, for messages.
    pub line: usize,
}

/// A direction's rates, exact, in bits per second; `min_bps <= max_bps`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rates {
    /// `Max Mbps`: HTB's `ceil` in LibreQoS.
    pub max_bps: u64,
    /// `Min Mbps`: HTB's `rate` in LibreQoS.
    pub min_bps: u64,
}

impl Rates {
    /// Max − Min: the excess rate when Min is taken as the committed rate (0 when equal).
    pub fn excess_bps(&self) -> u64 {
        self.max_bps - self.min_bps
    }
}

/// Why the file is refused: one line naming where and what.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ImportError {
    /// A cell's value, or a column of the header.
    #[error("line {line}, column \"{column}\": {reason}")]
    Cell {
        line: usize,
        column: String,
        reason: String,
    },
    /// The file or a row as a whole.
    #[error("line {line}: {reason}")]
    Line { line: usize, reason: String },
}

impl ImportError {
    /// The line the error is on.
    pub fn line(&self) -> usize {
        match self {
            Self::Cell { line, .. } | Self::Line { line, .. } => *line,
        }
    }
}

/// Reads a `ShapedDevices.csv` (see the module's documentation for what is accepted):
/// its circuits in the order of their first rows.
pub fn read(input: impl Read) -> Result<Vec<Circuit>, ImportError> {
    read_within(input, MAX_FILE_BYTES).map(|r| r.circuits)
}

/// What [`read_rows`] reads: the circuits, and where each came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rows {
    /// As [`read`] returns them.
    pub circuits: Vec<Circuit>,
    /// The header's line.
    pub header: usize,
    /// Each device row: its line and its circuit (an index in `circuits`), in file order.
    pub rows: Vec<(u32, u32)>,
}

/// [`read`], saying which line each circuit's rows are on (an apply keeps a digest of
/// each row, to read only the rows that changed the next time: [`crate::rows`]).
pub fn read_rows(input: impl Read) -> Result<Rows, ImportError> {
    read_within(input, MAX_FILE_BYTES)
}

/// [`read_rows`] of `bytes`: its circuits' and prefixes' tables made for as many rows as
/// that many bytes may hold (not grown a row at a time, rehashed at every doubling: the
/// better part of a million rows' read).
pub fn read_rows_of(bytes: &[u8]) -> Result<Rows, ImportError> {
    let rows = (bytes.len() / 48).min(MAX_ROWS);
    read_sized(bytes, MAX_FILE_BYTES, rows)
}

/// [`read_rows`], refusing a file of more than `most` bytes.
fn read_within(input: impl Read, most: u64) -> Result<Rows, ImportError> {
    read_sized(input, most, 0)
}

/// [`read_within`], its tables made for `rows` rows.
fn read_sized(input: impl Read, most: u64, rows: usize) -> Result<Rows, ImportError> {
    let expected = rows;
    let input = skip_bom(Bounded {
        inner: input,
        left: most,
    })?;
    let mut source = Source {
        csv: ReaderBuilder::new()
            .has_headers(false)
            .flexible(true)
            .comment(Some(b'#'))
            .from_reader(Lines::new(input)),
        most,
    };
    let mut record = ByteRecord::new();
    let Some(line) = source.next(&mut record)? else {
        return Err(line_error(
            1,
            "no header row (the file is empty or all comments)",
        ));
    };
    let header = line;
    let columns = Columns::of(&record, line)?;
    let mut circuits = Circuits::with_capacity(expected);
    let mut rows = Vec::with_capacity(expected);
    while let Some(line) = source.next(&mut record)? {
        if rows.len() >= MAX_ROWS {
            return Err(line_error(line, format!("more than {MAX_ROWS} rows")));
        }
        let circuit = circuits.add(&columns, &record, line)?;
        rows.push((line as u32, circuit as u32));
    }
    Ok(Rows {
        circuits: circuits.finish()?,
        header,
        rows,
    })
}

/// Rows read one at a time against a header, each line alone: an apply that reads only
/// the rows that changed since the last one ([`crate::rows`]). A line that is not one
/// record by itself (a quote left open, a carriage return inside) is refused: read in
/// its file it could be another.
pub struct Partial {
    columns: Columns,
    circuits: Circuits,
}

impl Partial {
    /// Rows under the header `header` (on line `line`).
    pub fn new(header: &[u8], line: usize) -> Result<Self, ImportError> {
        let record = alone(header, line)?.ok_or_else(|| line_error(line, "not a header row"))?;
        Ok(Self {
            columns: Columns::of(&record, line)?,
            circuits: Circuits::default(),
        })
    }

    /// The `Circuit ID` of the row `text` (line `line`), checked as [`read`] would;
    /// `None` for a line that is no row (empty, a comment).
    pub fn circuit_id(&self, text: &[u8], line: usize) -> Result<Option<String>, ImportError> {
        let Some(record) = alone(text, line)? else {
            return Ok(None);
        };
        let row = Row {
            record: &record,
            columns: &self.columns,
            line,
        };
        row.check_shape()?;
        Ok(Some(row.label(Field::Id, MAX_ID_BYTES)?.to_owned()))
    }

    /// Reads the row `text` (line `line`) into its circuit, as [`read`] would; a line
    /// that is no row is skipped.
    pub fn add(&mut self, text: &[u8], line: usize) -> Result<(), ImportError> {
        if let Some(record) = alone(text, line)? {
            self.circuits.add(&self.columns, &record, line)?;
        }
        Ok(())
    }

    /// The circuits of the rows added, in the order of their first rows.
    pub fn finish(self) -> Result<Vec<Circuit>, ImportError> {
        self.circuits.finish()
    }
}

/// The record of the line `text` (without its line feed) read alone; `None` if it is
/// none (empty, a comment). Refused if it is more than one record, or a cell of it
/// would take the line feed after it (a quote left open).
fn alone(text: &[u8], line: usize) -> Result<Option<ByteRecord>, ImportError> {
    let mut bytes = Vec::with_capacity(text.len() + 1);
    bytes.extend_from_slice(text);
    bytes.push(b'\n');
    let mut csv = ReaderBuilder::new()
        .has_headers(false)
        .flexible(true)
        .comment(Some(b'#'))
        .from_reader(&bytes[..]);
    let mut record = ByteRecord::new();
    let not_one = || line_error(line, "not one row on its own line");
    match csv.read_byte_record(&mut record) {
        Ok(false) => return Ok(None),
        Ok(true) => {}
        Err(_) => return Err(not_one()),
    }
    let mut next = ByteRecord::new();
    if !matches!(csv.read_byte_record(&mut next), Ok(false))
        || record
            .iter()
            .any(|c| c.contains(&b'\n') || c.contains(&b'\r'))
    {
        return Err(not_one());
    }
    Ok(Some(record))
}

fn line_error(line: usize, reason: impl Into<String>) -> ImportError {
    ImportError::Line {
        line,
        reason: reason.into(),
    }
}

/// The CSV records of the input, and their lines.
struct Source<R> {
    csv: csv::Reader<Lines<R>>,
    /// The file's bound, for the message.
    most: u64,
}

impl<R: Read> Source<R> {
    /// Reads the next record: the line it starts on, or None at the end.
    ///
    /// The csv crate's own positions are not lines: a record's is where the previous one
    /// ended, before any comment lines, and a CRLF counts differently from an LF. The line
    /// is counted here from the byte where the record ends instead.
    fn next(&mut self, record: &mut ByteRecord) -> Result<Option<usize>, ImportError> {
        match self.csv.read_byte_record(record) {
            Ok(false) => Ok(None),
            Ok(true) => {
                let end = self.csv.position().byte();
                let last = self.csv.get_ref().line_of(end.saturating_sub(1));
                // A quoted line break puts the start on an earlier line.
                let breaks = record.as_slice().iter().filter(|&&b| b == b'\n').count();
                Ok(Some(last.saturating_sub(breaks).max(1)))
            }
            Err(e) => {
                let line = self.csv.get_ref().line_of(u64::MAX);
                Err(match e.into_kind() {
                    csv::ErrorKind::Io(e) if e.kind() == io::ErrorKind::FileTooLarge => {
                        line_error(line, format!("the file is larger than {} bytes", self.most))
                    }
                    csv::ErrorKind::Io(e) => line_error(line, format!("cannot read: {e}")),
                    other => line_error(line, format!("{other:?}")),
                })
            }
        }
    }
}

/// The input, counting its lines: how many line feeds came before any byte read since
/// the latest read call.
///
/// The csv reader reads through a `BufReader`, which calls `read` only once every byte
/// before has been parsed: a record not yet returned ends in the latest chunk or after it,
/// so the line feeds of earlier chunks are only counted, and memory stays one chunk's.
struct Lines<R> {
    inner: R,
    /// Bytes given before the latest chunk.
    chunk_start: u64,
    /// Line feeds before the latest chunk.
    before: usize,
    /// The latest chunk's length.
    len: usize,
    /// Where the latest chunk's line feeds are, from its start.
    feeds: Vec<usize>,
}

impl<R> Lines<R> {
    fn new(inner: R) -> Self {
        Self {
            inner,
            chunk_start: 0,
            before: 0,
            len: 0,
            feeds: Vec::new(),
        }
    }

    /// The line (from 1) of the byte at `offset`, which is in the latest chunk or after.
    fn line_of(&self, offset: u64) -> usize {
        let in_chunk = self
            .feeds
            .partition_point(|&at| self.chunk_start + (at as u64) < offset);
        1 + self.before + in_chunk
    }
}

impl<R: Read> Read for Lines<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.before += self.feeds.len();
        self.chunk_start += self.len as u64;
        self.feeds.clear();
        self.feeds.extend(
            buf[..n]
                .iter()
                .enumerate()
                .filter(|(_, b)| **b == b'\n')
                .map(|(at, _)| at),
        );
        self.len = n;
        Ok(n)
    }
}

/// The input, failing once it has given more than `left` bytes.
struct Bounded<R> {
    inner: R,
    left: u64,
}

impl<R: Read> Read for Bounded<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.left == 0 {
            // At the bound: fine if the input ends here too.
            return match self.inner.read(&mut [0; 1])? {
                0 => Ok(0),
                _ => Err(io::ErrorKind::FileTooLarge.into()),
            };
        }
        let most = buf
            .len()
            .min(usize::try_from(self.left).unwrap_or(usize::MAX));
        let n = self.inner.read(&mut buf[..most])?;
        self.left -= n as u64;
        Ok(n)
    }
}

/// Skips a UTF-8 byte-order mark and refuses UTF-16's.
fn skip_bom(mut input: impl Read) -> Result<impl Read, ImportError> {
    let mut start = Vec::with_capacity(3);
    let mut byte = [0; 1];
    while start.len() < 3 {
        match input.read(&mut byte) {
            Ok(0) => break,
            Ok(_) => start.push(byte[0]),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(line_error(1, format!("cannot read: {e}"))),
        }
    }
    if start.starts_with(&[0xff, 0xfe]) || start.starts_with(&[0xfe, 0xff]) {
        return Err(line_error(
            1,
            "the file is UTF-16: convert it to UTF-8 first (iconv -f UTF-16 -t UTF-8)",
        ));
    }
    if start == [0xef, 0xbb, 0xbf] {
        start.clear();
    }
    Ok(io::Cursor::new(start).chain(input))
}

/// The columns the reader uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Field {
    Id,
    Name,
    Ipv4,
    Ipv6,
    DownloadMin,
    UploadMin,
    DownloadMax,
    UploadMax,
}

/// Each field, its name in LibreQoS's header, whether it is required and the header
/// names (normalized) LibreQoS takes for it.
const FIELDS: [(Field, &str, bool, &[&str]); 8] = [
    (Field::Id, "Circuit ID", true, &["circuitid"]),
    (Field::Name, "Circuit Name", false, &["circuitname"]),
    (Field::Ipv4, "IPv4", true, &["ipv4"]),
    (Field::Ipv6, "IPv6", true, &["ipv6"]),
    (
        Field::DownloadMin,
        "Download Min Mbps",
        true,
        &["downloadmin", "downloadminmbps"],
    ),
    (
        Field::UploadMin,
        "Upload Min Mbps",
        true,
        &["uploadmin", "uploadminmbps"],
    ),
    (
        Field::DownloadMax,
        "Download Max Mbps",
        true,
        &["downloadmax", "downloadmaxmbps"],
    ),
    (
        Field::UploadMax,
        "Upload Max Mbps",
        true,
        &["uploadmax", "uploadmaxmbps"],
    ),
];

/// LibreQoS's comparison of header names: letters and digits, lowercased.
fn normalize(header: &str) -> String {
    header
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .map(|c| c.to_ascii_lowercase())
        .collect()
}

/// Where each field is, from the header row.
struct Columns {
    /// Every header cell as written, for messages.
    headers: Vec<String>,
    /// The index of each field's column, in [`FIELDS`] order.
    index: [Option<usize>; FIELDS.len()],
}

impl Columns {
    fn of(record: &ByteRecord, line: usize) -> Result<Self, ImportError> {
        let headers: Vec<String> = record
            .iter()
            .map(|h| String::from_utf8_lossy(h.trim_ascii()).into_owned())
            .collect();
        let mut index = [None; FIELDS.len()];
        for (at, header) in headers.iter().enumerate() {
            let name = normalize(header);
            let Some(field) = FIELDS.iter().position(|f| f.3.contains(&name.as_str())) else {
                continue;
            };
            if let Some(first) = index[field] {
                return Err(ImportError::Cell {
                    line,
                    column: shown(header),
                    reason: format!(
                        "the header names {} twice (columns {} and {})",
                        FIELDS[field].1,
                        first + 1,
                        at + 1
                    ),
                });
            }
            index[field] = Some(at);
        }
        for (field, (_, name, required, _)) in FIELDS.iter().enumerate() {
            if *required && index[field].is_none() {
                return Err(ImportError::Cell {
                    line,
                    column: (*name).into(),
                    reason: "missing from the header (the first row that is not a comment \
                             names the columns)"
                        .into(),
                });
            }
        }
        Ok(Self { headers, index })
    }

    fn at(&self, field: Field) -> Option<usize> {
        self.index[FIELDS.iter().position(|f| f.0 == field).unwrap_or(0)]
    }

    /// The field's header as the file writes it, or LibreQoS's name for it.
    fn field_header(&self, field: Field) -> String {
        match self.at(field) {
            Some(at) => self.header(at),
            None => FIELDS
                .iter()
                .find(|f| f.0 == field)
                .map_or("", |f| f.1)
                .into(),
        }
    }

    /// The header of a column as the file writes it, or its number past the header.
    fn header(&self, at: usize) -> String {
        self.headers
            .get(at)
            .map_or_else(|| format!("#{}", at + 1), |h| shown(h))
    }
}

/// One row's cells, read against the header.
struct Row<'r> {
    record: &'r ByteRecord,
    columns: &'r Columns,
    line: usize,
}

impl Row<'_> {
    fn error(&self, field: Field, reason: impl Into<String>) -> ImportError {
        ImportError::Cell {
            line: self.line,
            column: self.columns.field_header(field),
            reason: reason.into(),
        }
    }

    /// The cell's text ("" when the field's column or the cell is missing).
    fn text(&self, field: Field) -> Result<&str, ImportError> {
        let Some(at) = self.columns.at(field) else {
            return Ok("");
        };
        // Trimmed, as LibreQoS's loader does (its csv reader's `Trim::All`).
        let bytes = self.record.get(at).unwrap_or_default().trim_ascii();
        std::str::from_utf8(bytes).map_err(|_| {
            self.error(
                field,
                format!(
                    "'{}' is not UTF-8: convert the file (iconv -f WINDOWS-1252 -t UTF-8)",
                    shown(&String::from_utf8_lossy(bytes))
                ),
            )
        })
    }

    /// Refuses a line break in any cell, and a row over [`MAX_ROW_BYTES`].
    fn check_shape(&self) -> Result<(), ImportError> {
        if self.record.as_slice().len() > MAX_ROW_BYTES {
            return Err(line_error(
                self.line,
                format!("the row is longer than {MAX_ROW_BYTES} bytes"),
            ));
        }
        match self
            .record
            .iter()
            .position(|c| c.contains(&b'\n') || c.contains(&b'\r'))
        {
            Some(at) => Err(ImportError::Cell {
                line: self.line,
                column: self.columns.header(at),
                reason: "a line break inside the cell (a quote left open?)".into(),
            }),
            None => Ok(()),
        }
    }

    /// A `Circuit ID` or `Circuit Name`: bounded, no control characters.
    fn label(&self, field: Field, most: usize) -> Result<&str, ImportError> {
        let text = self.text(field)?;
        if text.len() > most {
            return Err(self.error(
                field,
                format!("'{}' is longer than {most} bytes", shown(text)),
            ));
        }
        if text.chars().any(char::is_control) {
            return Err(self.error(
                field,
                format!("'{}' holds a control character", shown(text)),
            ));
        }
        Ok(text)
    }

    fn rate(&self, field: Field) -> Result<u64, ImportError> {
        let text = self.text(field)?;
        mbps_to_bps(text)
            .map_err(|why| self.error(field, format!("invalid rate '{}': {why}", shown(text))))
    }

    fn rates(&self, min: Field, max: Field) -> Result<Rates, ImportError> {
        let rates = Rates {
            min_bps: self.rate(min)?,
            max_bps: self.rate(max)?,
        };
        if rates.min_bps > rates.max_bps {
            return Err(self.error(
                min,
                format!(
                    "{} Mbps is above the Max of {} Mbps (Min cannot exceed Max)",
                    bps_to_mbps(rates.min_bps),
                    bps_to_mbps(rates.max_bps)
                ),
            ));
        }
        Ok(rates)
    }

    /// The cell's prefixes, with the field each came from.
    fn prefixes(&self, field: Field, out: &mut Vec<(IpNet, Field)>) -> Result<(), ImportError> {
        let text = self.text(field)?;
        if text.is_empty() {
            return Ok(());
        }
        for entry in text.split(',').map(str::trim) {
            let prefix =
                parse_prefix(entry, field == Field::Ipv6).map_err(|why| self.error(field, why))?;
            out.push((prefix, field));
        }
        Ok(())
    }
}

/// One entry of an `IPv4` or `IPv6` list.
fn parse_prefix(entry: &str, v6: bool) -> Result<IpNet, String> {
    if entry.is_empty() {
        return Err("an empty entry in the list (a comma too many?)".into());
    }
    let prefix = match entry.split_once('/') {
        // Digits only after the '/' (u8's parser would take "+24"); ipnet's own parser is
        // several times slower than std's, which matters at a million rows.
        Some((addr, len)) if !len.is_empty() && len.bytes().all(|b| b.is_ascii_digit()) => {
            match (addr.parse::<IpAddr>(), len.parse::<u8>()) {
                (Ok(addr), Ok(len)) => IpNet::new(addr, len).ok(),
                _ => None,
            }
        }
        Some(_) => None,
        None => entry.parse::<IpAddr>().ok().map(IpNet::from),
    };
    let why = match prefix {
        None if entry.contains('/') => "invalid prefix",
        None => "invalid address",
        Some(IpNet::V4(_)) if v6 => "is IPv4: put it in the IPv4 column",
        Some(IpNet::V6(_)) if !v6 => "is IPv6: put it in the IPv6 column",
        Some(IpNet::V6(p)) if p.addr().to_ipv4_mapped().is_some() => {
            "is IPv4-mapped: put the IPv4 address in the IPv4 column"
        }
        Some(p) if p.trunc() != p => "has host bits set",
        Some(p) => return Ok(p),
    };
    let shown = shown(entry);
    Err(match prefix {
        None => format!("{why} '{shown}'"),
        Some(p) if p.trunc() != p => format!("'{shown}' {why} (the prefix is {})", p.trunc()),
        Some(_) => format!("'{shown}' {why}"),
    })
}

/// The circuits read so far.
#[derive(Default)]
struct Circuits {
    list: Vec<Circuit>,
    /// Each circuit's index in `list`, found by its id (hashed with `ids`): not a copy of
    /// a million ids as keys.
    by_id: hashbrown::HashTable<u32>,
    ids: foldhash::fast::RandomState,
    /// Each prefix's circuit (index) and the line it was first on (both below
    /// [`MAX_ROWS`] and the lines of a file of [`MAX_FILE_BYTES`]: a million prefixes'
    /// table is the smaller).
    owner: HashMap<IpNet, (u32, u32)>,
}

impl Circuits {
    /// Made for `rows` rows (of a prefix or two each).
    fn with_capacity(rows: usize) -> Self {
        Self {
            list: Vec::with_capacity(rows),
            by_id: hashbrown::HashTable::with_capacity(rows),
            ids: Default::default(),
            owner: HashMap::with_capacity_and_hasher(2 * rows, Default::default()),
        }
    }

    /// Reads one row into its circuit: the circuit's index.
    fn add(
        &mut self,
        columns: &Columns,
        record: &ByteRecord,
        line: usize,
    ) -> Result<usize, ImportError> {
        let row = Row {
            record,
            columns,
            line,
        };
        row.check_shape()?;
        let id = row.label(Field::Id, MAX_ID_BYTES)?;
        if id.is_empty() {
            return Err(row.error(
                Field::Id,
                "empty: every row names its circuit (rows of one Circuit ID are one subscriber)",
            ));
        }
        let name = row.label(Field::Name, MAX_NAME_BYTES)?;
        let name = (!name.is_empty()).then(|| name.to_owned());
        // Addresses before rates, as LibreQoS orders its columns.
        let mut prefixes = Vec::new();
        row.prefixes(Field::Ipv4, &mut prefixes)?;
        row.prefixes(Field::Ipv6, &mut prefixes)?;
        let download = row.rates(Field::DownloadMin, Field::DownloadMax)?;
        let upload = row.rates(Field::UploadMin, Field::UploadMax)?;
        let hash = self.ids.hash_one(id);
        let list = &self.list;
        let circuit = match self.by_id.find(hash, |&at| list[at as usize].id == id) {
            Some(&at) => {
                let at = at as usize;
                agree(&row, &self.list[at], &name, download, upload)?;
                at
            }
            None => {
                let (list, ids) = (&self.list, &self.ids);
                self.by_id.insert_unique(hash, list.len() as u32, |&at| {
                    ids.hash_one(&list[at as usize].id)
                });
                self.list.push(Circuit {
                    id: id.to_owned(),
                    name,
                    prefixes: Vec::with_capacity(prefixes.len()),
                    download,
                    upload,
                    line: row.line,
                });
                self.list.len() - 1
            }
        };
        for (prefix, field) in prefixes {
            self.claim(&row, circuit, prefix, field)?;
        }
        Ok(circuit)
    }

    /// Gives the prefix to the circuit, unless another circuit has it.
    fn claim(
        &mut self,
        row: &Row,
        circuit: usize,
        prefix: IpNet,
        field: Field,
    ) -> Result<(), ImportError> {
        let count = self.owner.len();
        match self.owner.entry(prefix) {
            Entry::Occupied(o) if o.get().0 as usize == circuit => Ok(()),
            Entry::Occupied(o) => {
                let (other, line) = *o.get();
                Err(row.error(
                    field,
                    format!(
                        "{prefix} is already in circuit '{}' (line {line}): a prefix belongs \
                         to one circuit",
                        shown(&self.list[other as usize].id)
                    ),
                ))
            }
            Entry::Vacant(_) if count >= MAX_PREFIXES => Err(row.error(
                field,
                format!("more than {MAX_PREFIXES} prefixes in the file"),
            )),
            Entry::Vacant(v) => {
                v.insert((circuit as u32, row.line as u32));
                self.list[circuit].prefixes.push(prefix);
                Ok(())
            }
        }
    }

    fn finish(self) -> Result<Vec<Circuit>, ImportError> {
        if let Some(c) = self.list.iter().find(|c| c.prefixes.is_empty()) {
            return Err(ImportError::Cell {
                line: c.line,
                column: "IPv4".into(),
                reason: format!(
                    "circuit '{}' has no address in any row (IPv4 and IPv6 empty): it would \
                     shape nothing",
                    shown(&c.id)
                ),
            });
        }
        Ok(self.list)
    }
}

/// Refuses a row whose name or rates differ from its circuit's first row.
fn agree(
    row: &Row,
    first: &Circuit,
    name: &Option<String>,
    download: Rates,
    upload: Rates,
) -> Result<(), ImportError> {
    let differs = |field: Field, this: String, that: String| {
        row.error(
            field,
            format!(
                "'{this}' differs from '{that}' on line {}, the first row of circuit '{}': \
                 rows of one Circuit ID must agree",
                first.line,
                shown(&first.id)
            ),
        )
    };
    if *name != first.name {
        return Err(differs(
            Field::Name,
            shown(name.as_deref().unwrap_or_default()),
            shown(first.name.as_deref().unwrap_or_default()),
        ));
    }
    let pairs = [
        (Field::DownloadMin, download.min_bps, first.download.min_bps),
        (Field::UploadMin, upload.min_bps, first.upload.min_bps),
        (Field::DownloadMax, download.max_bps, first.download.max_bps),
        (Field::UploadMax, upload.max_bps, first.upload.max_bps),
    ];
    match pairs.iter().find(|(_, this, that)| this != that) {
        Some(&(field, this, that)) => Err(differs(field, bps_to_mbps(this), bps_to_mbps(that))),
        None => Ok(()),
    }
}

const BPS_PER_MBPS: u64 = 1_000_000;

/// A rate in Mbps, written in plain decimal digits, as exact bit/s; the error says why not.
pub fn mbps_to_bps(text: &str) -> Result<u64, String> {
    let (whole, fraction) = text.split_once('.').unwrap_or((text, ""));
    let digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
    if text.is_empty() {
        return Err("empty (a rate in Mbps is required)".into());
    }
    if whole.is_empty() && fraction.is_empty() || !digits(whole) || !digits(fraction) {
        return Err(not_decimal(text).into());
    }
    let (kept, rest) = fraction.split_at(fraction.len().min(6));
    if !rest.bytes().all(|b| b == b'0') {
        return Err("finer than 1 bit/s (at most 6 decimals of Mbps)".into());
    }
    let whole = whole.trim_start_matches('0');
    let too_large = || {
        format!(
            "above shaper's maximum of {} Mbps",
            bps_to_mbps(MAX_RATE_BPS)
        )
    };
    // 20 digits would overflow below; anything past 9 is over the maximum anyway.
    if whole.len() > 12 {
        return Err(too_large());
    }
    let whole: u64 = whole.parse().unwrap_or(0);
    let fraction = kept
        .bytes()
        .chain(std::iter::repeat(b'0'))
        .take(6)
        .fold(0, |n, digit| n * 10 + u64::from(digit - b'0'));
    let bps = whole * BPS_PER_MBPS + fraction;
    match bps {
        0 => Err("zero".into()),
        b if b < MIN_RATE_BPS => Err(format!(
            "below shaper's minimum of {} Mbps (one byte per second)",
            bps_to_mbps(MIN_RATE_BPS)
        )),
        b if b > MAX_RATE_BPS => Err(too_large()),
        b => Ok(b),
    }
}

/// Why the text is not plain decimal digits.
fn not_decimal(text: &str) -> &'static str {
    let lower = text.to_ascii_lowercase();
    if text.starts_with('-') {
        "negative"
    } else if text.starts_with('+') {
        "no sign, please: plain decimal digits"
    } else if ["nan", "inf", "infinity"].contains(&lower.trim_start_matches(['+', '-'])) {
        "not a number"
    } else if lower.contains('e') && lower.bytes().any(|b| b.is_ascii_digit()) {
        "no exponent, please: plain decimal digits"
    } else if text.contains(',') {
        "write the decimal point as '.', with no thousands separator"
    } else {
        "not a decimal number of Mbps"
    }
}

/// Exact bit/s as Mbps: `2500000` is `2.5`.
pub fn bps_to_mbps(bps: u64) -> String {
    let (whole, fraction) = (bps / BPS_PER_MBPS, bps % BPS_PER_MBPS);
    if fraction == 0 {
        return whole.to_string();
    }
    let fraction = format!("{fraction:06}");
    format!("{whole}.{}", fraction.trim_end_matches('0'))
}

/// A value as a message shows it: control characters escaped, long values cut.
fn shown(value: &str) -> String {
    const MOST: usize = 64;
    let mut out: String = value
        .chars()
        .take(MOST)
        .flat_map(|c| {
            let escaped: Vec<char> = if c.is_control() {
                c.escape_default().collect()
            } else {
                vec![c]
            };
            escaped
        })
        .collect();
    if value.chars().nth(MOST).is_some() {
        out.push('…');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_are_exact_decimal_mbps() {
        let ok = [
            ("2.5", 2_500_000),
            ("0.5", 500_000),
            (".5", 500_000),
            ("5.", 5_000_000),
            ("100", 100_000_000),
            ("0100.250", 100_250_000),
            ("10.000001", 10_000_001),
            ("1.2500000000", 1_250_000),
            ("0.000008", 8),
            ("100000000", MAX_RATE_BPS),
        ];
        for (text, bps) in ok {
            assert_eq!(mbps_to_bps(text), Ok(bps), "{text}");
            assert_eq!(mbps_to_bps(&bps_to_mbps(bps)), Ok(bps), "{text} round trip");
        }
        let refused = [
            ("", "empty"),
            ("-5", "negative"),
            ("+5", "no sign"),
            ("NaN", "not a number"),
            ("inf", "not a number"),
            ("1e3", "no exponent"),
            ("2,5", "decimal point"),
            ("1.0000001", "finer than 1 bit/s"),
            ("0", "zero"),
            ("0.000000", "zero"),
            ("0.000007", "below shaper's minimum of 0.000008 Mbps"),
            (
                "100000000.000001",
                "above shaper's maximum of 100000000 Mbps",
            ),
            ("99999999999999999999999", "above shaper's maximum"),
            ("1 0", "not a decimal"),
            (".", "not a decimal"),
            ("1.2.3", "not a decimal"),
        ];
        for (text, why) in refused {
            let err = mbps_to_bps(text).unwrap_err();
            assert!(err.contains(why), "{text}: {err}");
        }
    }

    /// A file over the bound is refused where the bound falls, not cut short there.
    #[test]
    fn the_file_is_bounded() {
        let row = "c-1,100.70.0.1,,1,1,100,20\n";
        let text =
            format!("Circuit ID,IPv4,IPv6,Download Min,Upload Min,Download Max,Upload Max\n{row}");
        let most = text.len() as u64;
        assert_eq!(
            read_within(text.as_bytes(), most).map(|r| r.circuits.len()),
            Ok(1)
        );
        let more = format!("{text}{}", row.replace("c-1,100.70.0.1", "c-2,100.70.0.2"));
        assert_eq!(
            read_within(more.as_bytes(), most).unwrap_err().to_string(),
            format!("line 3: the file is larger than {most} bytes")
        );
    }

    #[test]
    fn shown_escapes_and_cuts() {
        assert_eq!(shown("a\tb"), "a\\tb");
        assert_eq!(shown(&"x".repeat(65)), format!("{}…", "x".repeat(64)));
        assert_eq!(shown(&"x".repeat(64)), "x".repeat(64));
    }
}
