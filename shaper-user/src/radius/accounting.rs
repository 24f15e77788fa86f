//! RADIUS accounting (RFC 2866, RFC 2869's Gigawords) for `shaper run`: each subscriber
//! of the `[radius]` interface is a session; [`Sessions`] turns scans of the kernel's
//! counts into Start, Interim-Update and Stop records, and [`Sender`] sends them to the
//! configured servers in order, with retransmissions and failover, every queue bounded.
//!
//! - A session is a subscriber id present on the ingress or egress attachment (or both).
//!   Its Acct-Session-Id is `{daemon start, Unix milliseconds, hex}-{n, 8 hex}` (n counts
//!   the sessions this daemon started): stable for the session, never reused (a restart
//!   has another start). The sessions in progress are shared with the CoA listener
//!   ([`SessionIndex`]): a request naming one finds its subscriber.
//! - Input is the ingress attachment's counts (what the subscriber sends: its upload, as a
//!   NAS reports it), output the egress one's. Octets and packets are those delivered:
//!   passed (green, and yellow: passed marked) plus would-drop (monitor mode passes them);
//!   dropped (red, enforced) are not counted. They count from the session's Start: the
//!   kernel's counts at Start are its base.
//! - Interims are due every `interim` from Start; the sessions found at daemon start are
//!   spread evenly over the first interval.
//! - A scan reads both directions' entries in batches, each handed over as it is read
//!   ([`SubscriberTable::each_entry`]); the sessions are kept by key, and each entry's
//!   index remembers its id and session's key, so an entry whose id is the one the last
//!   scan saw there costs a comparison of 32 bytes, nothing looked up by id or allocated
//!   (at 100,000 subscribers every 5 s, the maps keyed by id this replaced cost several
//!   times the CPU: bench/results-accounting.md). An entry whose id changed (another
//!   subscriber at that index) is looked up by its id.
//! - The daemon's accounting begins with an Accounting-On and ends with an
//!   Accounting-Off (its Acct-Session-Id the daemon's, session number 0), each sent alone:
//!   every Start after the On is answered, the Off after every Stop is.
//! - Each request is retransmitted, as it was (same Identifier and Request
//!   Authenticator), every `timeout` until `retries` are spent, then built again (a new
//!   Identifier, Acct-Delay-Time updated, as RFC 2866 §5.2 asks) for the next server;
//!   after the last, it is lost (counted). New requests go to the server that answered
//!   last; the first is tried again [`FAILBACK`] after a failover.

use std::{
    collections::{HashMap, VecDeque},
    net::{Ipv4Addr, SocketAddr, UdpSocket},
    os::fd::AsRawFd as _,
    sync::{Arc, Mutex, PoisonError},
    time::{Duration, Instant, SystemTime},
};

use ipnet::{IpNet, Ipv6Net};
use md5::{Digest as _, Md5};

use shaper_common::maps::{Outcomes, SUBSCRIBER_ID_BYTES};

use crate::{
    maps::Pinned,
    pins::{Attachment, Direction},
    subscriber::{Counts, SubscriberError, SubscriberTable},
};

/// The port RFC 2866 assigns.
pub const DEFAULT_PORT: u16 = 1813;
pub const DEFAULT_INTERIM: Duration = Duration::from_secs(300);
/// `interim` is 1 s to a day.
pub const MIN_INTERIM: Duration = Duration::from_secs(1);
pub const MAX_INTERIM: Duration = Duration::from_secs(86_400);
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(3);
pub const DEFAULT_RETRIES: u32 = 2;
pub const MAX_RETRIES: u32 = 10;
pub const MAX_SERVERS: usize = 8;
/// Requests awaiting an answer at once, over every server (each socket has 256
/// Identifiers).
pub const MAX_IN_FLIGHT: usize = 256;
/// Records waiting to be sent: beyond, a new record is lost (counted).
pub const MAX_QUEUE: usize = 262_144;
/// How long after a failover new requests go to the first server again.
pub const FAILBACK: Duration = Duration::from_secs(60);

pub const ACCOUNTING_REQUEST: u8 = 4;
pub const ACCOUNTING_RESPONSE: u8 = 5;
const NAS_IP_ADDRESS: u8 = 4;
const FRAMED_IP_ADDRESS: u8 = 8;
const NAS_IDENTIFIER: u8 = 32;
const ACCT_STATUS_TYPE: u8 = 40;
const ACCT_DELAY_TIME: u8 = 41;
const ACCT_INPUT_OCTETS: u8 = 42;
const ACCT_OUTPUT_OCTETS: u8 = 43;
const ACCT_SESSION_ID: u8 = 44;
const ACCT_SESSION_TIME: u8 = 46;
const ACCT_INPUT_PACKETS: u8 = 47;
const ACCT_OUTPUT_PACKETS: u8 = 48;
const ACCT_TERMINATE_CAUSE: u8 = 49;
const ACCT_INPUT_GIGAWORDS: u8 = 52;
const ACCT_OUTPUT_GIGAWORDS: u8 = 53;
const EVENT_TIMESTAMP: u8 = 55;
const FRAMED_IPV6_PREFIX: u8 = 97;
const USER_NAME: u8 = 1;

/// Acct-Terminate-Cause of a removed subscriber: Admin-Reset.
pub const CAUSE_ADMIN_RESET: u32 = 6;
/// Acct-Terminate-Cause of every session when the daemon stops: Admin-Reboot.
pub const CAUSE_ADMIN_REBOOT: u32 = 7;

/// An accounting server and its shared secret.
#[derive(Clone, PartialEq, Eq)]
pub struct Server {
    pub address: SocketAddr,
    pub secret: Vec<u8>,
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Server {{ address: {}, secret: <hidden> }}",
            self.address
        )
    }
}

/// The `[radius.accounting]` table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// Tried in order.
    pub servers: Vec<Server>,
    pub interim: Duration,
    pub timeout: Duration,
    pub retries: u32,
    pub nas_identifier: String,
    pub nas_ip_address: Option<Ipv4Addr>,
}

/// What a record reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    Start = 1,
    Stop = 2,
    Interim = 3,
    /// The daemon's accounting starts: no session of its earlier runs is in progress.
    AccountingOn = 7,
    /// The daemon's accounting stops, every session's Stop sent before.
    AccountingOff = 8,
}

impl Status {
    /// Accounting-On and -Off are sent alone: everything queued before is answered (or
    /// given up) before one is sent, and nothing after it until it is.
    fn alone(self) -> bool {
        matches!(self, Self::AccountingOn | Self::AccountingOff)
    }
}

/// Packets and octets delivered.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    pub packets: u64,
    pub octets: u64,
}

impl Usage {
    /// What a subscriber's counts say was delivered: passed (green and yellow) and
    /// would-drop (monitor mode); not dropped.
    pub fn of(c: &Counts) -> Self {
        Self::of_outcomes(&c.outcomes)
    }

    /// [`Self::of`] an entry's outcomes.
    pub fn of_outcomes(o: &Outcomes) -> Self {
        Self {
            packets: o.passed_packets + o.would_drop_packets,
            octets: o.passed_bytes + o.would_drop_bytes,
        }
    }

    fn since(self, base: Self) -> Self {
        Self {
            packets: self.packets.saturating_sub(base.packets),
            octets: self.octets.saturating_sub(base.octets),
        }
    }
}

/// One Accounting-Request's content.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    pub status: Status,
    pub user: String,
    pub session_id: String,
    pub framed_v4: Option<Ipv4Addr>,
    pub framed_v6: Option<Ipv6Net>,
    pub input: Usage,
    pub output: Usage,
    pub session_secs: u32,
    pub cause: Option<u32>,
    /// When it happened (Event-Timestamp), and when it was made (Acct-Delay-Time counts
    /// from it).
    pub wall: SystemTime,
    pub made: Instant,
    /// The server to try (a failover's next); `None`: the one in favour.
    pub server: Option<usize>,
}

/// What the request names its NAS by.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Nas {
    pub identifier: String,
    pub ip: Option<Ipv4Addr>,
}

fn attr(out: &mut Vec<u8>, kind: u8, value: &[u8]) {
    // Every value here is under 254 octets (ids are 32 at most).
    let len = u8::try_from(value.len().min(253) + 2).unwrap_or(u8::MAX);
    out.push(kind);
    out.push(len);
    out.extend_from_slice(&value[..value.len().min(253)]);
}

fn int(out: &mut Vec<u8>, kind: u8, value: u32) {
    attr(out, kind, &value.to_be_bytes());
}

fn low(v: u64) -> u32 {
    (v & 0xffff_ffff) as u32
}

fn high(v: u64) -> u32 {
    u32::try_from(v >> 32).unwrap_or(u32::MAX)
}

/// The Accounting-Request of `r` with `identifier`, its Acct-Delay-Time `delay_secs`,
/// signed for `secret` (RFC 2866 §3: MD5 over the packet with 16 zero octets for the
/// Request Authenticator, then the secret).
pub fn encode(r: &Record, nas: &Nas, identifier: u8, delay_secs: u32, secret: &[u8]) -> Vec<u8> {
    let mut out = vec![ACCOUNTING_REQUEST, identifier, 0, 0];
    out.extend_from_slice(&[0; 16]);
    int(&mut out, ACCT_STATUS_TYPE, r.status as u32);
    attr(&mut out, ACCT_SESSION_ID, r.session_id.as_bytes());
    if !r.user.is_empty() {
        attr(&mut out, USER_NAME, r.user.as_bytes());
    }
    if !nas.identifier.is_empty() {
        attr(&mut out, NAS_IDENTIFIER, nas.identifier.as_bytes());
    }
    if let Some(ip) = nas.ip {
        attr(&mut out, NAS_IP_ADDRESS, &ip.octets());
    }
    if let Some(ip) = r.framed_v4 {
        attr(&mut out, FRAMED_IP_ADDRESS, &ip.octets());
    }
    if let Some(net) = r.framed_v6 {
        // RFC 3162 §2.3: reserved, length, then the prefix's significant octets.
        let len = net.prefix_len();
        let octets = net.network().octets();
        let mut v = vec![0, len];
        v.extend_from_slice(&octets[..usize::from(len.div_ceil(8))]);
        attr(&mut out, FRAMED_IPV6_PREFIX, &v);
    }
    let stamp = r
        .wall
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    int(&mut out, EVENT_TIMESTAMP, low(stamp));
    int(&mut out, ACCT_DELAY_TIME, delay_secs);
    if matches!(r.status, Status::Interim | Status::Stop) {
        int(&mut out, ACCT_SESSION_TIME, r.session_secs);
        int(&mut out, ACCT_INPUT_OCTETS, low(r.input.octets));
        int(&mut out, ACCT_INPUT_GIGAWORDS, high(r.input.octets));
        int(&mut out, ACCT_INPUT_PACKETS, low(r.input.packets));
        int(&mut out, ACCT_OUTPUT_OCTETS, low(r.output.octets));
        int(&mut out, ACCT_OUTPUT_GIGAWORDS, high(r.output.octets));
        int(&mut out, ACCT_OUTPUT_PACKETS, low(r.output.packets));
    }
    if let Some(cause) = r.cause {
        int(&mut out, ACCT_TERMINATE_CAUSE, cause);
    }
    let len = u16::try_from(out.len()).unwrap_or(u16::MAX);
    out[2..4].copy_from_slice(&len.to_be_bytes());
    super::packet::sign_request(&mut out, secret);
    out
}

/// Whether `response` is the Accounting-Response to `request` from the server of
/// `secret`: its code, Identifier and Length right, and its Response Authenticator MD5
/// over it with the request's authenticator in its place, then the secret.
pub fn response_authentic(response: &[u8], request: &[u8], secret: &[u8]) -> bool {
    let Ok(p) = super::packet::Packet::parse(response) else {
        return false;
    };
    if p.code != ACCOUNTING_RESPONSE || request.len() < 20 || p.identifier != request[1] {
        return false;
    }
    let mut md5 = Md5::new();
    md5.update(&p.raw[..4]);
    md5.update(&request[4..20]);
    md5.update(&p.raw[20..]);
    md5.update(secret);
    let want = md5.finalize();
    want.iter()
        .zip(p.authenticator)
        .fold(0u8, |acc, (a, b)| acc | (a ^ b))
        == 0
}

/// The sessions in progress, by Acct-Session-Id: each one's subscriber id. The accounting
/// thread keeps it as it starts and stops sessions; the CoA listener reads it (a request
/// naming a session: [`crate::radius::request::Target::Session`]). Cloned, it is shared.
#[derive(Clone, Debug, Default)]
pub struct SessionIndex(Arc<Mutex<HashMap<String, String>>>);

impl SessionIndex {
    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<String, String>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The subscriber id of session `session_id`, if it is in progress.
    pub fn subscriber(&self, session_id: &str) -> Option<String> {
        self.map().get(session_id).cloned()
    }

    fn insert(&self, session_id: &str, id: &str) {
        self.map().insert(session_id.to_owned(), id.to_owned());
    }

    fn remove(&self, session_id: &str) {
        self.map().remove(session_id);
    }
}

/// One accounting session: a subscriber id on either direction or both.
struct Session {
    id: String,
    session_id: String,
    started: Instant,
    /// Input (ingress) and output (egress): the kernel's counts at Start, and at the last
    /// scan.
    base: [Usage; 2],
    last: [Usage; 2],
    /// This scan's counts of each direction, and the scan that read them (stale where it
    /// is not this one: the subscriber is not on that direction now).
    now: [Usage; 2],
    now_scan: [u32; 2],
    next_interim: Instant,
    framed_v4: Option<Ipv4Addr>,
    framed_v6: Option<Ipv6Net>,
}

impl Session {
    /// Its record of `status` at `now`: its counts at the last scan, from Start.
    fn record(&self, status: Status, now: Instant, wall: SystemTime) -> Record {
        let [i, o] = self.last;
        Record {
            status,
            user: self.id.clone(),
            session_id: self.session_id.clone(),
            framed_v4: self.framed_v4,
            framed_v6: self.framed_v6,
            input: i.since(self.base[0]),
            output: o.since(self.base[1]),
            session_secs: u32::try_from(now.duration_since(self.started).as_secs())
                .unwrap_or(u32::MAX),
            cause: None,
            wall,
            made: now,
            server: None,
        }
    }

    /// Whether scan `scan` saw it on either direction.
    fn seen(&self, scan: u32) -> bool {
        self.now_scan.contains(&scan)
    }

    /// Its counts as scan `scan` read them: nothing on a direction it is not on.
    fn counts(&self, scan: u32) -> [Usage; 2] {
        [0, 1].map(|d| match self.now_scan[d] == scan {
            true => self.now[d],
            false => Usage::default(),
        })
    }
}

/// No session.
const NONE: u32 = u32::MAX;

/// An entry of one direction's table as the last scan saw it: its id as the kernel has
/// it (NUL-padded) and the key of its session in [`Sessions`]. An entry whose id is the
/// same at the next scan is that session's without a look-up; one whose id changed (a
/// subscriber removed and another set at its index) is looked up by its id.
#[derive(Clone, Copy)]
struct Slot {
    id: [u8; SUBSCRIBER_ID_BYTES],
    session: u32,
    scan: u32,
}

const EMPTY: Slot = Slot {
    id: [0; SUBSCRIBER_ID_BYTES],
    session: NONE,
    scan: 0,
};

/// The sessions of one daemon. A scan hands it each entry of each direction's table
/// ([`Self::saw`]), then makes the records ([`Self::end`]): a subscriber unchanged since
/// the last scan costs a comparison of its id and nothing allocated.
pub struct Sessions {
    /// When the daemon started, Unix milliseconds: the first part of every session id.
    daemon_start: u64,
    started: u64,
    index: SessionIndex,
    interim: Duration,
    /// The sessions in progress, by key (the key of one ended is reused: `free`).
    live: Vec<Option<Session>>,
    free: Vec<u32>,
    by_id: HashMap<String, u32>,
    /// Each direction's entries (input: ingress, output: egress), by index.
    slots: [Vec<Slot>; 2],
    /// The scan under way (from 1).
    scan: u32,
    /// The ids this scan saw with no session, and their counts.
    new: HashMap<String, [Usage; 2]>,
    /// Whether a scan was made: the sessions of the first are spread over the interval.
    scanned: bool,
}

/// The first IPv4 /32 and the first IPv6 prefix of `prefixes`.
fn framed(prefixes: &[IpNet]) -> (Option<Ipv4Addr>, Option<Ipv6Net>) {
    let v4 = prefixes.iter().find_map(|p| match p {
        IpNet::V4(n) if n.prefix_len() == 32 => Some(n.addr()),
        _ => None,
    });
    let v6 = prefixes.iter().find_map(|p| match p {
        IpNet::V6(n) => Some(*n),
        IpNet::V4(_) => None,
    });
    (v4, v6)
}

/// Whether counts went under a session's last: its subscriber was removed and set again
/// between two scans.
fn went_back(now: &[Usage; 2], last: &[Usage; 2]) -> bool {
    now[0].octets < last[0].octets || now[1].octets < last[1].octets
}

/// A direction's place in [`Session::base`] and the like: input is ingress.
fn way(d: Direction) -> usize {
    match d {
        Direction::Ingress => 0,
        Direction::Egress => 1,
    }
}

impl Sessions {
    /// The sessions of a daemon started at `daemon_start`, kept in `index` too.
    pub fn new(interim: Duration, daemon_start: SystemTime, index: SessionIndex) -> Self {
        Self {
            daemon_start: daemon_start
                .duration_since(SystemTime::UNIX_EPOCH)
                .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
            started: 0,
            index,
            interim,
            live: Vec::new(),
            free: Vec::new(),
            by_id: HashMap::new(),
            slots: [Vec::new(), Vec::new()],
            scan: 0,
            new: HashMap::new(),
            scanned: false,
        }
    }

    pub fn len(&self) -> usize {
        self.by_id.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_id.is_empty()
    }

    /// A scan begins: [`Self::saw`] each entry in use, then [`Self::end`] (a scan that
    /// fails half way is forgotten at the next one's start).
    pub fn begin(&mut self) {
        self.scan = self.scan.wrapping_add(1).max(1);
        self.new.clear();
    }

    /// The scan read entry `index` of direction `d`'s table: subscriber `id` (NUL-padded),
    /// `usage` delivered.
    pub fn saw(&mut self, d: Direction, index: u32, id: &[u8; SUBSCRIBER_ID_BYTES], usage: Usage) {
        let (w, i) = (way(d), index as usize);
        let slots = &mut self.slots[w];
        if slots.len() <= i {
            slots.resize(i + 1, EMPTY);
        }
        let slot = &mut slots[i];
        slot.scan = self.scan;
        let key = match slot.session != NONE && slot.id == *id {
            true => slot.session,
            // Another subscriber at this index, or its first scan here: by its id.
            false => {
                let name = crate::subscriber::unpadded(id);
                slot.id = *id;
                let Some(&key) = self.by_id.get(&name) else {
                    slot.session = NONE;
                    self.new.entry(name).or_default()[w] = usage;
                    return;
                };
                slot.session = key;
                key
            }
        };
        if let Some(s) = self.live[key as usize].as_mut() {
            s.now[w] = usage;
            s.now_scan[w] = self.scan;
        }
    }

    /// The ids this scan saw with no session yet, or whose counts went back (set again):
    /// their prefixes are wanted by [`Self::end`].
    pub fn starting(&self) -> Vec<&str> {
        let back = self
            .live
            .iter()
            .flatten()
            .filter(|s| s.seen(self.scan) && went_back(&s.counts(self.scan), &s.last));
        self.new
            .keys()
            .map(String::as_str)
            .chain(back.map(|s| s.id.as_str()))
            .collect()
    }

    fn stop(&self, s: &Session, cause: u32, now: Instant, wall: SystemTime) -> Record {
        self.index.remove(&s.session_id);
        let mut r = s.record(Status::Stop, now, wall);
        r.cause = Some(cause);
        r
    }

    /// The records of the scan at `now`: Stop for each session gone (or set again: its
    /// counts went back), Start for each new one (its prefixes from `prefixes`), Interim
    /// for each due.
    pub fn end(
        &mut self,
        prefixes: &HashMap<String, Vec<IpNet>>,
        now: Instant,
        wall: SystemTime,
    ) -> Vec<Record> {
        let scan = self.scan;
        // The entries not seen are no one's now.
        for slot in self.slots.iter_mut().flatten() {
            if slot.scan != scan {
                *slot = EMPTY;
            }
        }
        let mut out = Vec::new();
        // Set again: ended, and started again under the same key (the slots name it).
        let mut again: Vec<(String, [Usage; 2], u32)> = Vec::new();
        for key in 0..self.live.len() {
            let Some(s) = self.live[key].as_mut() else {
                continue;
            };
            let counts = s.counts(scan);
            if s.seen(scan) && !went_back(&counts, &s.last) {
                s.last = counts;
                continue;
            }
            let Some(s) = self.live[key].take() else {
                continue;
            };
            out.push(self.stop(&s, CAUSE_ADMIN_RESET, now, wall));
            if s.seen(scan) {
                again.push((s.id, counts, key as u32));
            } else {
                self.by_id.remove(&s.id);
                self.free.push(key as u32);
            }
        }
        let mut new: Vec<(String, [Usage; 2], u32)> = std::mem::take(&mut self.new)
            .into_iter()
            .map(|(id, counts)| (id, counts, NONE))
            .chain(again)
            .collect();
        new.sort_by(|a, b| a.0.cmp(&b.0));
        let n = u32::try_from(new.len()).unwrap_or(u32::MAX).max(1);
        for (k, (id, base, key)) in (0u32..).zip(new) {
            // The first scan's sessions spread over the interval; later ones' interims
            // fall where they started.
            let first = match self.scanned {
                false => self.interim * (k + 1) / n,
                true => self.interim,
            };
            let (framed_v4, framed_v6) = framed(prefixes.get(&id).map_or(&[][..], Vec::as_slice));
            self.started += 1;
            let s = Session {
                session_id: self.session_id(self.started),
                started: now,
                base,
                last: base,
                now: base,
                now_scan: [scan; 2],
                next_interim: now + first,
                framed_v4,
                framed_v6,
                id,
            };
            out.push(s.record(Status::Start, now, wall));
            self.index.insert(&s.session_id, &s.id);
            let key = match key {
                NONE => self.place(s),
                key => {
                    self.live[key as usize] = Some(s);
                    key
                }
            };
            if let Some(s) = &self.live[key as usize] {
                self.by_id.insert(s.id.clone(), key);
            }
        }
        self.scanned = true;
        for s in self.live.iter_mut().flatten() {
            if s.next_interim <= now {
                // Due again one interval on, or from now if scans fell behind by more.
                s.next_interim = (s.next_interim + self.interim).max(now);
                out.push(s.record(Status::Interim, now, wall));
            }
        }
        out
    }

    /// Keeps `s` under a free key: its key.
    fn place(&mut self, s: Session) -> u32 {
        match self.free.pop() {
            Some(key) => {
                self.live[key as usize] = Some(s);
                key
            }
            None => {
                self.live.push(Some(s));
                u32::try_from(self.live.len() - 1).unwrap_or(NONE)
            }
        }
    }

    /// Session `n`'s Acct-Session-Id: the daemon's start and `n`, in hex.
    fn session_id(&self, n: u64) -> String {
        format!("{:X}-{n:08X}", self.daemon_start)
    }

    /// The daemon's Accounting-On or Accounting-Off (`status`): no user, no counts; its
    /// Acct-Session-Id the daemon's, session number 0.
    pub fn accounting(&self, status: Status, now: Instant, wall: SystemTime) -> Record {
        Record {
            status,
            user: String::new(),
            session_id: self.session_id(0),
            framed_v4: None,
            framed_v6: None,
            input: Usage::default(),
            output: Usage::default(),
            session_secs: 0,
            cause: None,
            wall,
            made: now,
            server: None,
        }
    }

    /// A Stop for every session (the daemon stops), Admin-Reboot.
    pub fn stop_all(&mut self, now: Instant, wall: SystemTime) -> Vec<Record> {
        let live = std::mem::take(&mut self.live);
        self.by_id.clear();
        self.free.clear();
        self.slots = [Vec::new(), Vec::new()];
        live.iter()
            .flatten()
            .map(|s| self.stop(s, CAUSE_ADMIN_REBOOT, now, wall))
            .collect()
    }
}

/// Reads every subscriber of `iface`'s attachments into `sessions` (a scan: then
/// [`Sessions::starting`] and [`Sessions::end`]): each direction's entries in use, read
/// in batches, nothing kept but what changed. The tables read, for [`prefixes`].
pub fn scan(
    iface: &str,
    netns: Option<&str>,
    sessions: &mut Sessions,
) -> Result<Vec<SubscriberTable>, SubscriberError> {
    sessions.begin();
    let mut tables = Vec::new();
    for d in [Direction::Ingress, Direction::Egress] {
        let at = Attachment::toward(iface, netns, d);
        if !at.exists() {
            continue;
        }
        let table = SubscriberTable::of(&Pinned::open(&at)?)?;
        table.each_entry(|i, s| sessions.saw(d, i, &s.id, Usage::of_outcomes(&s.outcomes)))?;
        tables.push(table);
    }
    Ok(tables)
}

/// The prefixes of the subscribers `wanted`, from `tables` (the first that has each).
pub fn prefixes(
    tables: &[SubscriberTable],
    wanted: &[&str],
) -> Result<HashMap<String, Vec<IpNet>>, SubscriberError> {
    let mut out: HashMap<String, Vec<IpNet>> = HashMap::new();
    if wanted.is_empty() {
        return Ok(out);
    }
    let wanted: std::collections::HashSet<&str> = wanted.iter().copied().collect();
    for t in tables {
        for i in t.list()? {
            if wanted.contains(i.spec.id.as_str()) && !out.contains_key(&i.spec.id) {
                out.insert(i.spec.id, i.spec.prefixes);
            }
        }
    }
    Ok(out)
}

/// A server's counters (`/metrics`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ServerStats {
    pub server: String,
    /// Requests sent, retransmissions included.
    pub requests: u64,
    /// Accounting-Responses that matched a request and its authenticator.
    pub responses: u64,
    /// Requests given up on this server after its retries (each went to the next server).
    pub timeouts: u64,
}

/// The accounting's counters.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    pub servers: Vec<ServerStats>,
    /// Records no server answered, or that found the queue full.
    pub lost: u64,
    pub sessions: u64,
}

struct InFlight {
    record: Record,
    server: usize,
    packet: Vec<u8>,
    sent: Instant,
    tries: u32,
}

/// The requests' sockets (one per family in use, 256 Identifiers each), queue and
/// requests in flight.
pub struct Sender {
    config: Config,
    nas: Nas,
    sockets: [Option<UdpSocket>; 2],
    slots: [Vec<Option<InFlight>>; 2],
    cursor: [usize; 2],
    in_flight: usize,
    queue: VecDeque<Record>,
    favoured: usize,
    failed_over: Option<Instant>,
    stats: Stats,
}

fn family(a: &SocketAddr) -> usize {
    usize::from(a.is_ipv6())
}

impl Sender {
    /// Binds a socket for each family the servers use (call it in the daemon's
    /// namespace).
    pub fn new(config: Config, nas: Nas) -> std::io::Result<Self> {
        let mut sockets = [None, None];
        for s in &config.servers {
            let f = family(&s.address);
            if sockets[f].is_none() {
                let any: SocketAddr = match f {
                    0 => (Ipv4Addr::UNSPECIFIED, 0).into(),
                    _ => (std::net::Ipv6Addr::UNSPECIFIED, 0).into(),
                };
                let sock = UdpSocket::bind(any)?;
                sock.set_nonblocking(true)?;
                sockets[f] = Some(sock);
            }
        }
        let stats = Stats {
            servers: config
                .servers
                .iter()
                .map(|s| ServerStats {
                    server: s.address.to_string(),
                    ..ServerStats::default()
                })
                .collect(),
            ..Stats::default()
        };
        Ok(Self {
            config,
            nas,
            sockets,
            slots: [
                (0..256).map(|_| None).collect(),
                (0..256).map(|_| None).collect(),
            ],
            cursor: [0, 0],
            in_flight: 0,
            queue: VecDeque::new(),
            favoured: 0,
            failed_over: None,
            stats,
        })
    }

    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    pub fn set_sessions(&mut self, n: usize) {
        self.stats.sessions = n as u64;
    }

    /// Nothing queued or awaiting an answer.
    pub fn idle(&self) -> bool {
        self.queue.is_empty() && self.in_flight == 0
    }

    /// Queues `records`; those beyond [`MAX_QUEUE`] are lost.
    pub fn queue(&mut self, records: Vec<Record>) {
        for r in records {
            if self.queue.len() >= MAX_QUEUE {
                self.stats.lost += 1;
            } else {
                self.queue.push_back(r);
            }
        }
    }

    /// Sends what it can, retransmits or fails over what timed out, and takes the
    /// answers that come until `until` (or the next timeout, if sooner).
    pub fn step(&mut self, until: Instant) {
        let now = Instant::now();
        if self
            .failed_over
            .is_some_and(|at| now.duration_since(at) >= FAILBACK)
        {
            self.favoured = 0;
            self.failed_over = None;
        }
        self.expire(now);
        self.send_queued(now);
        let next = self
            .slots
            .iter()
            .flatten()
            .flatten()
            .map(|f| f.sent + self.config.timeout)
            .min()
            .map_or(until, |t| t.min(until));
        self.receive(next);
    }

    fn expire(&mut self, now: Instant) {
        for f in 0..2 {
            for id in 0..256 {
                let Some(x) = &mut self.slots[f][id] else {
                    continue;
                };
                if now.duration_since(x.sent) < self.config.timeout {
                    continue;
                }
                if x.tries <= self.config.retries {
                    x.tries += 1;
                    x.sent = now;
                    let addr = self.config.servers[x.server].address;
                    if let Some(sock) = &self.sockets[f] {
                        let _ = sock.send_to(&x.packet, addr);
                    }
                    self.stats.servers[x.server].requests += 1;
                    continue;
                }
                let Some(x) = self.slots[f][id].take() else {
                    continue;
                };
                self.in_flight -= 1;
                self.stats.servers[x.server].timeouts += 1;
                let next = x.server + 1;
                if self.favoured == x.server && next < self.config.servers.len() {
                    self.favoured = next;
                    self.failed_over = Some(now);
                }
                if next < self.config.servers.len() {
                    let mut r = x.record;
                    r.server = Some(next);
                    self.queue.push_front(r);
                } else {
                    self.stats.lost += 1;
                }
            }
        }
    }

    /// Whether an Accounting-On or -Off awaits its answer.
    fn alone_in_flight(&self) -> bool {
        self.slots
            .iter()
            .flatten()
            .flatten()
            .any(|x| x.record.status.alone())
    }

    fn send_queued(&mut self, now: Instant) {
        if self.alone_in_flight() {
            return;
        }
        while self.in_flight < MAX_IN_FLIGHT {
            let Some(front) = self.queue.front() else {
                return;
            };
            let alone = front.status.alone();
            if alone && self.in_flight > 0 {
                return;
            }
            let Some(r) = self.queue.pop_front() else {
                return;
            };
            let server = r.server.unwrap_or(self.favoured);
            let addr = self.config.servers[server].address;
            let f = family(&addr);
            let Some(id) = (0..256)
                .map(|k| (self.cursor[f] + k) % 256)
                .find(|id| self.slots[f][*id].is_none())
            else {
                self.queue.push_front(r);
                return;
            };
            self.cursor[f] = (id + 1) % 256;
            let delay = u32::try_from(now.duration_since(r.made).as_secs()).unwrap_or(u32::MAX);
            let secret = &self.config.servers[server].secret;
            let packet = encode(&r, &self.nas, id as u8, delay, secret);
            if let Some(sock) = &self.sockets[f] {
                // A failed send is retried as a lost datagram would be.
                let _ = sock.send_to(&packet, addr);
            }
            self.stats.servers[server].requests += 1;
            self.slots[f][id] = Some(InFlight {
                record: r,
                server,
                packet,
                sent: now,
                tries: 1,
            });
            self.in_flight += 1;
            if alone {
                return;
            }
        }
    }

    /// Waits for answers until `until`, taking every one that comes; back sooner when an
    /// answer made room for a request that waits.
    fn receive(&mut self, until: Instant) {
        let mut buf = [0u8; super::packet::MAX_PACKET];
        loop {
            let wait = until.saturating_duration_since(Instant::now());
            if !self.poll(wait) {
                return;
            }
            for f in 0..2 {
                while let Some(Ok((n, from))) =
                    self.sockets[f].as_ref().map(|s| s.recv_from(&mut buf))
                {
                    self.answer(f, &buf[..n], from);
                }
            }
            // Room freed for what waits: back to send it.
            let room = self.in_flight < MAX_IN_FLIGHT && !self.queue.is_empty();
            if room || Instant::now() >= until {
                return;
            }
        }
    }

    /// Whether a socket has a datagram within `wait`.
    fn poll(&self, wait: Duration) -> bool {
        let mut fds: Vec<libc::pollfd> = self
            .sockets
            .iter()
            .flatten()
            .map(|s| libc::pollfd {
                fd: s.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        let ms = i32::try_from(wait.as_millis()).unwrap_or(i32::MAX);
        let n = fds.len() as libc::nfds_t;
        // SAFETY: `fds` is a live array of `n` pollfd.
        let ready = unsafe { libc::poll(fds.as_mut_ptr(), n, ms) };
        ready > 0
    }

    /// An answer on family `f`'s socket: the request it answers, from its server, with
    /// the right authenticator; anything else is ignored.
    fn answer(&mut self, f: usize, datagram: &[u8], from: SocketAddr) {
        let Some(&id) = datagram.get(1) else { return };
        let id = usize::from(id);
        let Some(x) = &self.slots[f][id] else { return };
        let server = &self.config.servers[x.server];
        let from = SocketAddr::new(from.ip().to_canonical(), from.port());
        let want = SocketAddr::new(server.address.ip().to_canonical(), server.address.port());
        if from != want || !response_authentic(datagram, &x.packet, &server.secret) {
            return;
        }
        self.stats.servers[x.server].responses += 1;
        self.slots[f][id] = None;
        self.in_flight -= 1;
    }
}

/// The host's name, for NAS-Identifier by default.
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_owned())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests;
