//! The access log: one line per request, formatted on the worker and
//! written by a dedicated thread so a slow disk never stalls a connection.
//! When the writer falls behind, lines are dropped and counted.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::net::IpAddr;
use std::os::fd::AsFd;
use std::path::Path;
use std::sync::atomic::{AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use tlsgate_config::{Config, ConfigError, LogFormat, LogTarget};
use tlsgate_metrics::types::Counter;
use tlsgate_sys::privileges::Ids;
use tlsgate_tls::ClientIdentity;

/// Lines waiting for the writer before new ones are dropped.
const QUEUE: usize = 65_536;

/// Bytes of lines (as allocated) waiting for the writer before new ones
/// are dropped, whatever their number: an output that stops taking lines
/// (a pipe nobody reads) costs at most this much memory. Documented in
/// docs/config.md (`[access_log]`).
pub const QUEUE_BYTES: usize = 16 << 20;

/// Bytes of a client-supplied field (method, request target, referer,
/// user agent; repeated fields counted joined) that a line holds. A longer
/// field is cut after this many bytes and marked: `\...` in the combined
/// format (a client's `\` is always written `\x5C`, so the mark cannot be
/// the client's), `...` in JSON with the field's name in `truncated`.
/// Documented in docs/config.md (`[access_log]`).
pub const FIELD_MAX: usize = 2048;

/// What is known about one finished request.
pub struct Record<'a> {
    /// Client address.
    pub remote: IpAddr,
    /// When the request head was complete.
    pub time: SystemTime,
    /// Method as sent.
    pub method: &'a str,
    /// Request target as sent.
    pub target: &'a [u8],
    /// "HTTP/1.1" or "HTTP/1.0".
    pub version: &'a str,
    /// Response status.
    pub status: u16,
    /// Response body bytes.
    pub body_bytes: u64,
    /// Referer header.
    pub referer: Option<&'a [u8]>,
    /// User-Agent header.
    pub user_agent: Option<&'a [u8]>,
    /// Time from head to response written.
    pub duration: Duration,
    /// TLS SNI, if any.
    pub sni: Option<&'a str>,
    /// Negotiated TLS version.
    pub tls_version: Option<&'a str>,
    /// Whether the response went out through kernel TLS.
    pub ktls: bool,
    /// The verified client certificate (mutual TLS), if any.
    pub client: Option<&'a ClientIdentity>,
    /// The upstream server of a proxied request, if one was tried.
    pub upstream: Option<&'a str>,
    /// Why a proxied request failed (`connect`, `response_timeout`...).
    pub upstream_error: Option<&'a str>,
}

enum Msg {
    Line(String),
    /// Look at the shared state (a reopen waiting): sent when the queue
    /// has room; when it has none the writer looks after its next line.
    Wake,
}

/// What the workers, the main thread and the writer share besides the
/// queue. Nothing here is ever waited for without a limit.
struct State {
    /// A target to switch to (reload, rotation); the newest wins.
    reopen: Mutex<Option<LogTarget>>,
    /// Lines accepted into the queue.
    queued: AtomicU64,
    /// Bytes (capacity) of the lines in the queue, at most [`QUEUE_BYTES`].
    queued_bytes: AtomicUsize,
    /// Lines the writer has finished with (written and flushed, or lost).
    done: Mutex<u64>,
    done_changed: Condvar,
    /// `tlsgate_access_log_dropped_total`.
    dropped: Counter,
    /// The format of new lines ([`FORMAT_OFF`] for no log): the process's,
    /// like the sink, so that a reload switches both at once and lines of
    /// connections from before it do not mix formats in one file.
    format: AtomicU8,
}

const FORMAT_OFF: u8 = 0;
const FORMAT_COMBINED: u8 = 1;
const FORMAT_JSON: u8 = 2;

fn format_code(target: &LogTarget, format: LogFormat) -> u8 {
    match (target, format) {
        (LogTarget::Off, _) => FORMAT_OFF,
        (_, LogFormat::Combined) => FORMAT_COMBINED,
        (_, LogFormat::Json) => FORMAT_JSON,
    }
}

/// The sending side; cheap to clone into every worker.
#[derive(Clone)]
pub struct AccessLog {
    tx: SyncSender<Msg>,
    state: Arc<State>,
}

/// A lock that a panicked holder cannot make unusable: the data (a
/// target, a count) is valid whatever the holder did.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl AccessLog {
    /// Starts the writer thread on `target`, lines in `format`; lines it
    /// loses are counted in `dropped`.
    pub fn start(target: &LogTarget, format: LogFormat, dropped: Counter) -> io::Result<AccessLog> {
        let sink = open(target)?;
        let (tx, rx) = sync_channel(QUEUE);
        let state = Arc::new(State {
            reopen: Mutex::new(None),
            queued: AtomicU64::new(0),
            queued_bytes: AtomicUsize::new(0),
            done: Mutex::new(0),
            done_changed: Condvar::new(),
            dropped,
            format: AtomicU8::new(format_code(target, format)),
        });
        let shared = state.clone();
        std::thread::Builder::new()
            .name("access-log".into())
            .spawn(move || writer(rx, sink, &shared))?;
        Ok(AccessLog { tx, state })
    }

    /// Queues a line; false when the queue is full, by lines ([`QUEUE`])
    /// or by bytes ([`QUEUE_BYTES`]) (the caller counts it).
    pub fn log(&self, line: String) -> bool {
        let size = line.capacity();
        let bytes = &self.state.queued_bytes;
        // Taken before sending, so that the writer's release of the line
        // can never come first.
        if bytes.fetch_add(size, Ordering::Relaxed) + size > QUEUE_BYTES {
            bytes.fetch_sub(size, Ordering::Relaxed);
            return false;
        }
        match self.tx.try_send(Msg::Line(line)) {
            Ok(()) => {
                self.state.queued.fetch_add(1, Ordering::Relaxed);
                true
            }
            Err(TrySendError::Full(_)) => {
                bytes.fetch_sub(size, Ordering::Relaxed);
                false
            }
            Err(TrySendError::Disconnected(_)) => {
                bytes.fetch_sub(size, Ordering::Relaxed);
                true
            }
        }
    }

    /// The format of new lines; `None` when the log is off.
    pub fn format(&self) -> Option<LogFormat> {
        match self.state.format.load(Ordering::Relaxed) {
            FORMAT_COMBINED => Some(LogFormat::Combined),
            FORMAT_JSON => Some(LogFormat::Json),
            _ => None,
        }
    }

    /// Switches to a new target and format (on reload; also reopens a
    /// rotated file). Never waits: a writer stuck on its output (a pipe
    /// nobody reads) must not hold up the reload that calls this.
    pub fn reopen(&self, target: LogTarget, format: LogFormat) {
        self.state
            .format
            .store(format_code(&target, format), Ordering::Relaxed);
        *lock(&self.state.reopen) = Some(target);
        let _ = self.tx.try_send(Msg::Wake);
    }

    /// Waits at most `limit` until every line queued so far is written;
    /// the lines still unwritten then are counted as dropped and returned.
    pub fn flush(&self, limit: Duration) -> u64 {
        let target = self.state.queued.load(Ordering::Relaxed);
        let deadline = Instant::now() + limit;
        let mut done = lock(&self.state.done);
        while *done < target {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            done = self
                .state
                .done_changed
                .wait_timeout(done, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        let lost = target.saturating_sub(*done);
        self.state.dropped.inc_by(lost);
        lost
    }
}

enum Sink {
    Off,
    /// A descriptor of its own for standard output (a duplicate): whole
    /// lines go out in one write(2), and what a failed write took is known.
    Stdout(File),
    File(File),
}

fn open(target: &LogTarget) -> io::Result<Sink> {
    Ok(match target {
        LogTarget::Off => Sink::Off,
        LogTarget::Stdout => Sink::Stdout(File::from(io::stdout().as_fd().try_clone_to_owned()?)),
        LogTarget::File(p) => Sink::File(
            OpenOptions::new()
                .create(true)
                .append(true)
                .open(p)
                .map_err(|e| {
                    io::Error::new(
                        e.kind(),
                        format!("cannot open access log {}: {e}", p.display()),
                    )
                })?,
        ),
    })
}

/// At most one warning about lost lines per this long: a full disk must
/// not turn every request into a line of the server's own log.
const WARN_EVERY: Duration = Duration::from_secs(10);

/// Bytes of lines gathered before they are written, if the queue does
/// not empty first.
const OUT_BUFFER: usize = 32 * 1024;

/// The sink with what is needed to count what it loses and to keep a
/// failed write from gluing a cut line to the next one.
struct Output<'a> {
    sink: Sink,
    /// Whole lines not written yet, and how many.
    buf: Vec<u8>,
    lines: u64,
    /// A write failed partway through a line: the output ends with that
    /// line's first bytes and no newline.
    torn: Option<Torn>,
    /// Lines lost since the last warning, and when that was.
    lost: u64,
    warned: Option<Instant>,
    dropped: &'a Counter,
}

/// Where a cut line's bytes are, to take them back.
#[derive(Clone, Copy)]
struct Torn {
    /// The cut line's bytes at the end of the output.
    len: u64,
    /// The file's length after them (files only): the line is taken back
    /// only if nobody appended since.
    end: Option<u64>,
}

impl Output<'_> {
    fn new(sink: Sink, dropped: &Counter) -> Output<'_> {
        Output {
            sink,
            buf: Vec::with_capacity(OUT_BUFFER),
            lines: 0,
            torn: None,
            lost: 0,
            warned: None,
            dropped,
        }
    }

    fn write(&mut self, line: &str) {
        if matches!(self.sink, Sink::Off) {
            return;
        }
        if !self.buf.is_empty() && self.buf.len() + line.len() > OUT_BUFFER {
            self.flush();
        }
        self.buf.extend_from_slice(line.as_bytes());
        self.lines += 1;
    }

    /// Writes the gathered lines. A line the output took only part of is
    /// taken back from a file (or ended, where it cannot be), and every
    /// line not written whole is counted as lost.
    fn flush(&mut self) {
        if self.buf.is_empty() {
            return;
        }
        let lines = std::mem::take(&mut self.lines);
        let is_file = matches!(self.sink, Sink::File(_));
        let mut failure = None;
        if let Sink::Stdout(f) | Sink::File(f) = &mut self.sink {
            let (done, e) = match mend(f, &mut self.torn) {
                Ok(()) => write_some(f, &self.buf),
                Err(e) => (0, Some(e)),
            };
            if let Some(e) = e {
                let written = &self.buf[..done];
                let cut = after_last_line(written);
                if cut > 0 {
                    self.torn = Some(Torn {
                        len: cut as u64,
                        end: is_file
                            .then(|| f.metadata().ok().map(|m| m.len()))
                            .flatten(),
                    });
                }
                failure = Some((count_lines(written), e));
            }
        }
        if let Some((written, e)) = failure {
            self.lose(lines - written, &e);
        }
        self.buf.clear();
        if self.buf.capacity() > OUT_BUFFER {
            self.buf = Vec::with_capacity(OUT_BUFFER);
        }
    }

    /// Writes to `sink` from now on (a reload, a reopened file), once the
    /// old output's cut line, if any, is mended as far as it can be. The
    /// caller has flushed.
    fn switch(&mut self, sink: Sink) {
        if let Sink::Stdout(f) | Sink::File(f) = &mut self.sink {
            let _ = mend(f, &mut self.torn);
        }
        self.torn = None;
        self.sink = sink;
    }

    fn lose(&mut self, lines: u64, e: &io::Error) {
        self.dropped.inc_by(lines);
        self.lost += lines;
        if self.warned.is_none_or(|t| t.elapsed() >= WARN_EVERY) {
            tracing::warn!(
                "access log write failed: {e}; {} lines lost since the last such warning (at most one per {WARN_EVERY:?})",
                self.lost
            );
            self.lost = 0;
            self.warned = Some(Instant::now());
        }
    }
}

/// Before the next lines: takes a cut line back from the end of a file,
/// or else ends it with a newline of its own, so that it cannot run into
/// the next line. A file that grew since (another writer appended) is
/// left as it is: truncating would cut that writer's line.
fn mend(f: &mut File, torn: &mut Option<Torn>) -> io::Result<()> {
    let Some(t) = *torn else {
        return Ok(());
    };
    if let Some(end) = t.end {
        match f.metadata().map(|m| m.len()) {
            Ok(len) if len == end => {
                if f.set_len(end - t.len).is_ok() {
                    *torn = None;
                    return Ok(());
                }
            }
            Ok(_) => {
                *torn = None;
                return Ok(());
            }
            Err(_) => {}
        }
    }
    match f.write(b"\n") {
        Ok(1) => {
            *torn = None;
            Ok(())
        }
        Ok(_) => Err(io::ErrorKind::WriteZero.into()),
        Err(e) => Err(e),
    }
}

/// Writes `buf` until it is all written or a write fails: the bytes
/// written, and the failure.
fn write_some(f: &mut File, buf: &[u8]) -> (usize, Option<io::Error>) {
    let mut done = 0;
    while done < buf.len() {
        match f.write(&buf[done..]) {
            Ok(0) => return (done, Some(io::ErrorKind::WriteZero.into())),
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return (done, Some(e)),
        }
    }
    (done, None)
}

/// Bytes after the last newline: a line's first part.
fn after_last_line(bytes: &[u8]) -> usize {
    bytes.len() - bytes.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1)
}

fn count_lines(bytes: &[u8]) -> u64 {
    bytes.iter().filter(|&&b| b == b'\n').count() as u64
}

fn writer(rx: Receiver<Msg>, sink: Sink, state: &State) {
    let mut out = Output::new(sink, &state.dropped);
    // Lines taken off the queue, written or lost.
    let mut taken = 0u64;
    let mut pending = 0usize;
    loop {
        // Block for the first message, then drain without blocking and
        // flush once the queue is empty: one write(2) per burst.
        let msg = if pending == 0 {
            match rx.recv() {
                Ok(m) => m,
                Err(_) => {
                    out.flush();
                    return;
                }
            }
        } else {
            match rx.try_recv() {
                Ok(m) => m,
                Err(_) => {
                    out.flush();
                    pending = 0;
                    *lock(&state.done) = taken;
                    state.done_changed.notify_all();
                    continue;
                }
            }
        };
        if let Msg::Line(line) = msg {
            out.write(&line);
            taken += 1;
            let size = line.capacity();
            drop(line);
            state.queued_bytes.fetch_sub(size, Ordering::Relaxed);
        }
        // Counted as pending even for a wake-up, so the done count is
        // published once the queue is empty.
        pending += 1;
        let reopen = lock(&state.reopen).take();
        if let Some(target) = reopen {
            out.flush();
            match open(&target) {
                Ok(s) => out.switch(s),
                Err(e) => tracing::error!("{e}; keeping the previous access log"),
            }
        }
    }
}

/// Whether the access log's file can be opened for appending by the
/// process as it will run: by `as_user` (`server.user`, judged by the
/// permission bits: the process cannot become that user to try), else by
/// trying. Checked before any socket opens and before a reload is taken.
pub(crate) fn check_target(config: &Config, as_user: Option<Ids>) -> Result<(), ConfigError> {
    let LogTarget::File(p) = &config.access_log.target else {
        return Ok(());
    };
    let fail = |problem: String| {
        ConfigError::new(
            &config.origin,
            "access_log.target",
            format!("cannot open {} for appending: {problem}", p.display()),
        )
    };
    if let Some(ids) = as_user {
        use std::os::unix::fs::MetadataExt;
        let (what, meta) = match std::fs::metadata(p) {
            Ok(m) => ("the file", m),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                let dir = match p.parent() {
                    Some(d) if !d.as_os_str().is_empty() => d,
                    _ => Path::new("."),
                };
                let m = std::fs::metadata(dir)
                    .map_err(|e| fail(format!("directory {}: {e}", dir.display())))?;
                if !m.is_dir() {
                    return Err(fail(format!("{} is not a directory", dir.display())));
                }
                ("its directory", m)
            }
            Err(e) => return Err(fail(e.to_string())),
        };
        let mode = meta.mode();
        let writable = ids.uid == 0
            || (meta.uid() == ids.uid && mode & 0o200 != 0)
            || (meta.uid() != ids.uid && meta.gid() == ids.gid && mode & 0o020 != 0)
            || (meta.uid() != ids.uid && meta.gid() != ids.gid && mode & 0o002 != 0);
        if !writable {
            return Err(fail(format!(
                "{what} is not writable by server.user (uid {} gid {})",
                ids.uid, ids.gid
            )));
        }
        return Ok(());
    }
    let existed = std::fs::symlink_metadata(p).is_ok();
    OpenOptions::new()
        .create(true)
        .append(true)
        .open(p)
        .map_err(|e| fail(e.to_string()))?;
    if !existed {
        // Only a check: the writer creates it when it starts.
        let _ = std::fs::remove_file(p);
    }
    Ok(())
}

const HEX_UPPER: &[u8; 16] = b"0123456789ABCDEF";
const HEX_LOWER: &[u8; 16] = b"0123456789abcdef";

/// The digit of the low four bits of `n` in `table`.
fn hex_digit(table: &[u8; 16], n: u32) -> char {
    char::from(table[(n & 0xf) as usize])
}

/// Appends `bytes` for a quoted log field: printable ASCII as is, `"` and
/// `\` and everything else escaped as `\xHH` (as nginx does).
fn escaped(out: &mut String, bytes: &[u8]) {
    out.reserve(bytes.len());
    for &b in bytes {
        if (0x20..0x7f).contains(&b) && b != b'"' && b != b'\\' {
            out.push(char::from(b));
        } else {
            out.push_str("\\x");
            out.push(hex_digit(HEX_UPPER, u32::from(b >> 4)));
            out.push(hex_digit(HEX_UPPER, u32::from(b)));
        }
    }
}

/// A client-supplied field cut to [`FIELD_MAX`] bytes, and whether it was.
fn cut(bytes: &[u8]) -> (&[u8], bool) {
    match bytes.get(..FIELD_MAX) {
        Some(head) if bytes.len() > FIELD_MAX => (head, true),
        _ => (bytes, false),
    }
}

/// [`escaped`] for a client-supplied field: at most [`FIELD_MAX`] of its
/// bytes, then `\...` when there were more.
fn escaped_field(out: &mut String, bytes: &[u8]) {
    let (head, truncated) = cut(bytes);
    escaped(out, head);
    if truncated {
        out.push_str("\\...");
    }
}

/// Formats one record as a full line (with newline).
pub fn format(format: LogFormat, r: &Record<'_>) -> String {
    match format {
        LogFormat::Combined => combined(r),
        LogFormat::Json => json(r),
    }
}

fn combined(r: &Record<'_>) -> String {
    use std::fmt::Write as _;
    let t = time::OffsetDateTime::from(r.time);
    let mut s = String::with_capacity(160);
    // The client certificate's name goes where the format has the
    // authenticated user (as Apache's SSLUserName does), spaces escaped
    // so that the line still splits into its fields.
    let _ = write!(s, "{} - ", r.remote);
    match r.client {
        Some(c) => user_field(&mut s, c.short_name()),
        None => s.push('-'),
    }
    let _ = write!(
        s,
        " [{:02}/{}/{}:{:02}:{:02}:{:02} +0000] \"",
        t.day(),
        month_abbr(t.month()),
        t.year(),
        t.hour(),
        t.minute(),
        t.second()
    );
    escaped_field(&mut s, r.method.as_bytes());
    s.push(' ');
    escaped_field(&mut s, r.target);
    let _ = write!(s, " {}\" {} {} \"", r.version, r.status, r.body_bytes);
    escaped_field(&mut s, r.referer.unwrap_or(b"-"));
    s.push_str("\" \"");
    escaped_field(&mut s, r.user_agent.unwrap_or(b"-"));
    s.push('"');
    // Proxied requests only: the combined format's fields stay as they are,
    // and these two stay one field each (spaces escaped).
    if let Some(u) = r.upstream {
        s.push_str(" upstream=");
        user_field(&mut s, u);
    }
    if let Some(e) = r.upstream_error {
        s.push_str(" upstream_error=");
        user_field(&mut s, e);
    }
    s.push('\n');
    s
}

/// An unquoted field: like [`escaped`], and spaces escaped too.
fn user_field(out: &mut String, name: &str) {
    if name.is_empty() {
        out.push('-');
    }
    for (i, part) in name.split(' ').enumerate() {
        if i > 0 {
            out.push_str("\\x20");
        }
        escaped(out, part.as_bytes());
    }
}

fn month_abbr(m: time::Month) -> &'static str {
    use time::Month::*;
    match m {
        January => "Jan",
        February => "Feb",
        March => "Mar",
        April => "Apr",
        May => "May",
        June => "Jun",
        July => "Jul",
        August => "Aug",
        September => "Sep",
        October => "Oct",
        November => "Nov",
        December => "Dec",
    }
}

/// The JSON line. Target, referer and user agent are bytes as sent but
/// JSON strings are text: bytes that are not UTF-8 are written lossily,
/// each invalid sequence as U+FFFD (the combined format keeps every byte).
/// Method, target, referer and user agent longer than [`FIELD_MAX`] bytes
/// are cut there (before the lossy reading: a character split by the cut
/// reads as U+FFFD), `...` is appended, and the key `truncated` (only
/// then present) lists their names. Characters that some readers take for
/// a line end or a terminal control are escaped (see
/// [`escape_line_breakers`]).
fn json(r: &Record<'_>) -> String {
    let mut truncated = Vec::new();
    let mut lossy = |name: &'static str, b: &[u8]| {
        let (head, cut_off) = cut(b);
        let mut s = String::from_utf8_lossy(head).into_owned();
        if cut_off {
            s.push_str("...");
            truncated.push(name);
        }
        s
    };
    let method = lossy("method", r.method.as_bytes());
    let target = lossy("target", r.target);
    let referer = r.referer.map(|b| lossy("referer", b));
    let user_agent = r.user_agent.map(|b| lossy("user_agent", b));
    let t = time::OffsetDateTime::from(r.time);
    let mut v = serde_json::json!({
        "time": t.format(&time::format_description::well_known::Rfc3339).unwrap_or_default(),
        "remote": r.remote.to_string(),
        "method": method,
        "target": target,
        "version": r.version,
        "status": r.status,
        "bytes": r.body_bytes,
        "duration_us": u64::try_from(r.duration.as_micros()).unwrap_or(u64::MAX),
        "referer": referer,
        "user_agent": user_agent,
        "sni": r.sni,
        "tls": r.tls_version,
        "ktls": r.ktls,
        "client": r.client.map(|c| serde_json::json!({
            "subject": c.subject,
            "sans": c.sans,
            "sha256": c.sha256_hex(),
        })),
        "upstream": r.upstream,
        "upstream_error": r.upstream_error,
    });
    if let (false, Some(o)) = (truncated.is_empty(), v.as_object_mut()) {
        o.insert("truncated".into(), truncated.into());
    }
    let mut s = escape_line_breakers(v.to_string());
    s.push('\n');
    s
}

/// JSON allows DEL, the C1 controls and U+2028/U+2029 raw in a string, and
/// serde_json writes them so. But Python's `str.splitlines`, some log
/// shippers and terminals take NEL, LS and PS for line ends and C1's CSI
/// for an escape sequence: a client could split its own record in two
/// there. They can only stand inside a string (JSON's syntax is ASCII), so
/// they are written as `\uXXXX` escapes, which every JSON reader decodes
/// back to the same text.
fn escape_line_breakers(line: String) -> String {
    let breaks = |c: char| matches!(c, '\u{7f}'..='\u{9f}' | '\u{2028}' | '\u{2029}');
    if !line.contains(breaks) {
        return line;
    }
    let mut out = String::with_capacity(line.len() + 16);
    for c in line.chars() {
        if breaks(c) {
            let n = u32::from(c);
            out.push_str("\\u");
            for shift in [12, 8, 4, 0] {
                out.push(hex_digit(HEX_LOWER, n >> shift));
            }
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// A file holding `content`, open for appending (the directory goes
    /// with the test).
    fn temp_file(content: &[u8]) -> (tempfile::TempDir, std::path::PathBuf, File) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log");
        std::fs::write(&path, content).unwrap();
        let f = OpenOptions::new().append(true).open(&path).unwrap();
        (dir, path, f)
    }

    #[test]
    fn a_cut_line_is_taken_back_from_the_end_of_the_file() {
        let (_dir, path, mut f) = temp_file(b"one\ntw");
        let mut torn = Some(Torn {
            len: 2,
            end: Some(6),
        });
        mend(&mut f, &mut torn).unwrap();
        assert!(torn.is_none());
        assert_eq!(std::fs::read(&path).unwrap(), b"one\n");
    }

    #[test]
    fn a_cut_line_that_cannot_be_taken_back_is_ended_by_a_newline() {
        // No length known (standard output): the line is ended instead.
        let (_dir, path, mut f) = temp_file(b"one\ntw");
        let mut torn = Some(Torn { len: 2, end: None });
        mend(&mut f, &mut torn).unwrap();
        f.write_all(b"three\n").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"one\ntw\nthree\n");
    }

    #[test]
    fn a_file_another_writer_appended_to_is_not_truncated() {
        let (_dir, path, mut f) = temp_file(b"one\ntwother\n");
        let mut torn = Some(Torn {
            len: 2,
            end: Some(6),
        });
        mend(&mut f, &mut torn).unwrap();
        assert!(torn.is_none());
        assert_eq!(std::fs::read(&path).unwrap(), b"one\ntwother\n");
    }

    #[test]
    fn every_line_a_failed_write_held_is_counted_as_lost() {
        let full = OpenOptions::new().write(true).open("/dev/full").unwrap();
        let dropped = Counter::default();
        let mut out = Output::new(Sink::File(full), &dropped);
        for _ in 0..5 {
            out.write("GET / 200\n");
        }
        out.flush();
        assert_eq!(dropped.get(), 5);
        // What the buffer held is gone: the next flush loses only its own.
        out.write("GET / 200\n");
        out.flush();
        assert_eq!(dropped.get(), 6);
    }

    #[test]
    fn a_write_cut_short_keeps_its_whole_lines_and_its_cut_one_is_taken_back() {
        let (_dir, path, f) = temp_file(b"");
        let dropped = Counter::default();
        let mut out = Output::new(Sink::File(f), &dropped);
        // As the writer finds it after a write that stopped inside a line.
        std::fs::write(&path, b"one\ntw").unwrap();
        out.torn = Some(Torn {
            len: 2,
            end: Some(6),
        });
        out.write("three\n");
        out.flush();
        assert_eq!(std::fs::read(&path).unwrap(), b"one\nthree\n");
        assert_eq!(count_lines(b"a\nb\nc"), 2);
        assert_eq!(after_last_line(b"a\nbc"), 2);
        assert_eq!(after_last_line(b"abc"), 3);
        assert_eq!(after_last_line(b"a\n"), 0);
    }

    fn rec() -> Record<'static> {
        Record {
            remote: "127.0.0.1".parse().unwrap(),
            time: SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000),
            method: "GET",
            target: b"/a\"b",
            version: "HTTP/1.1",
            status: 200,
            body_bytes: 42,
            referer: None,
            user_agent: Some(b"curl/8\x01"),
            duration: Duration::from_micros(1500),
            sni: Some("localhost"),
            tls_version: Some("TLSv1.3"),
            ktls: false,
            client: None,
            upstream: None,
            upstream_error: None,
        }
    }

    #[test]
    fn proxied_requests_name_the_upstream_and_the_error() {
        let r = Record {
            status: 502,
            upstream: Some("10.0.0.1:80"),
            upstream_error: Some("connect"),
            ..rec()
        };
        let line = format(LogFormat::Combined, &r);
        assert!(
            line.ends_with("\" upstream=10.0.0.1:80 upstream_error=connect\n"),
            "{line}"
        );
        let v: serde_json::Value = serde_json::from_str(&format(LogFormat::Json, &r)).unwrap();
        assert_eq!(v["upstream"], "10.0.0.1:80");
        assert_eq!(v["upstream_error"], "connect");
        // Whatever an upstream is named, it stays one field.
        let r = Record {
            upstream: Some("app one:80"),
            ..r
        };
        let line = format(LogFormat::Combined, &r);
        assert!(line.contains(" upstream=app\\x20one:80 "), "{line}");
    }

    #[test]
    fn json_escapes_what_readers_take_for_line_ends_and_controls() {
        let r = Record {
            target: "/a\u{2028}b\u{85}c\u{9b}d\u{7f}e\u{2029}/é".as_bytes(),
            user_agent: Some("x\u{2028}{\"forged\":1}".as_bytes()),
            ..rec()
        };
        let line = format(LogFormat::Json, &r);
        assert!(
            !line.contains(['\u{2028}', '\u{2029}', '\u{85}', '\u{9b}', '\u{7f}']),
            "{line}"
        );
        assert_eq!(line.lines().count(), 1, "{line}");
        assert!(
            line.contains(r#"/a\u2028b\u0085c\u009bd\u007fe\u2029/é"#),
            "{line}"
        );
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(v["target"], "/a\u{2028}b\u{85}c\u{9b}d\u{7f}e\u{2029}/é");
        assert_eq!(v["user_agent"], "x\u{2028}{\"forged\":1}");
        // Python's reading of lines, which breaks at U+2028 and U+0085.
        assert_eq!(
            line.trim_end()
                .split(['\u{2028}', '\u{2029}', '\u{85}'])
                .count(),
            1
        );
    }

    #[test]
    fn combined_format_escapes() {
        let line = format(LogFormat::Combined, &rec());
        assert_eq!(
            line,
            "127.0.0.1 - - [14/Nov/2023:22:13:20 +0000] \"GET /a\\x22b HTTP/1.1\" 200 42 \"-\" \"curl/8\\x01\"\n"
        );
    }

    #[test]
    fn client_certificate_name_is_the_user_field() {
        let id = ClientIdentity {
            subject: "CN=svc a,O=Example".into(),
            common_name: Some("svc a\"".into()),
            sans: vec!["DNS:a.internal".into()],
            sha256: [0xab; 32],
        };
        let r = Record {
            client: Some(&id),
            ..rec()
        };
        let line = format(LogFormat::Combined, &r);
        assert!(
            line.starts_with("127.0.0.1 - svc\\x20a\\x22 [14/Nov/2023"),
            "{line}"
        );
        let v: serde_json::Value = serde_json::from_str(&format(LogFormat::Json, &r)).unwrap();
        assert_eq!(v["client"]["subject"], "CN=svc a,O=Example");
        assert_eq!(v["client"]["sans"][0], "DNS:a.internal");
        assert_eq!(v["client"]["sha256"], "ab".repeat(32));
        let plain: serde_json::Value =
            serde_json::from_str(&format(LogFormat::Json, &rec())).unwrap();
        assert!(plain["client"].is_null());
    }

    #[test]
    fn json_format_parses() {
        let line = format(LogFormat::Json, &rec());
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(v["status"], 200);
        assert_eq!(v["target"], "/a\"b");
        assert_eq!(v["duration_us"], 1500);
        assert_eq!(v["time"], "2023-11-14T22:13:20Z");
    }

    #[test]
    fn long_client_fields_are_cut_and_marked() {
        let long = vec![0xffu8; 10_000];
        let path = [b"/".as_slice(), &[b'a'; 5000]].concat();
        let r = Record {
            target: &path,
            referer: Some(&long),
            user_agent: Some(&long[..FIELD_MAX]),
            ..rec()
        };
        let line = format(LogFormat::Combined, &r);
        let fields: Vec<&str> = line.split('"').collect();
        let want_path = format!("GET /{}\\... HTTP/1.1", "a".repeat(FIELD_MAX - 1));
        assert_eq!(fields[1], want_path);
        assert_eq!(fields[3], format!("{}\\...", "\\xFF".repeat(FIELD_MAX)));
        // Exactly FIELD_MAX bytes: whole, no mark.
        assert_eq!(fields[5], "\\xFF".repeat(FIELD_MAX));
        assert!(line.len() < 3 * 4 * FIELD_MAX + 200, "{}", line.len());

        let v: serde_json::Value = serde_json::from_str(&format(LogFormat::Json, &r)).unwrap();
        assert_eq!(v["target"], format!("/{}...", "a".repeat(FIELD_MAX - 1)));
        assert_eq!(v["referer"], format!("{}...", "\u{fffd}".repeat(FIELD_MAX)));
        assert_eq!(v["user_agent"], "\u{fffd}".repeat(FIELD_MAX));
        assert_eq!(v["truncated"], serde_json::json!(["target", "referer"]));
        let plain: serde_json::Value =
            serde_json::from_str(&format(LogFormat::Json, &rec())).unwrap();
        assert!(plain.get("truncated").is_none());
    }

    #[test]
    fn the_queue_is_bounded_in_bytes() {
        // A FIFO opened by no reader's end is never read: the writer
        // blocks on its first line and every later line waits in the queue.
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("log.fifo");
        assert!(std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap()
            .success());
        let reader = {
            let fifo = fifo.clone();
            std::thread::spawn(move || std::fs::File::open(fifo).unwrap())
        };
        let log = AccessLog::start(
            &LogTarget::File(fifo),
            LogFormat::Combined,
            Counter::default(),
        )
        .unwrap();
        let _reader = reader.join().unwrap();
        let line = "x".repeat(100_000) + "\n";
        let mut taken = 0usize;
        for _ in 0..1000 {
            if log.log(line.clone()) {
                taken += 1;
            }
        }
        // The pipe and the file's buffer hold a few lines, the queue the rest.
        assert!(taken > 100, "{taken}");
        assert!(taken * line.len() <= QUEUE_BYTES + (1 << 20), "{taken}");
        assert!(log.state.queued_bytes.load(Ordering::Relaxed) <= QUEUE_BYTES);
        // Small lines still fit by count up to the byte bound.
        assert!(!log.log(line.clone()));
    }

    #[test]
    fn file_target_gets_lines() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("access.log");
        let log = AccessLog::start(
            &LogTarget::File(p.clone()),
            LogFormat::Combined,
            Counter::default(),
        )
        .unwrap();
        assert!(log.log("one\n".into()));
        assert!(log.log("two\n".into()));
        assert_eq!(log.flush(Duration::from_secs(5)), 0);
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "one\ntwo\n");
    }
}
