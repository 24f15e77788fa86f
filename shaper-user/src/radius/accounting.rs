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
        let o = &c.outcomes;
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

/// A subscriber as a scan saw it: its delivered counts on each direction it is set on.
#[derive(Clone, Debug, Default)]
pub struct Seen {
    pub input: Option<Usage>,
    pub output: Option<Usage>,
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

struct Session {
    session_id: String,
    started: Instant,
    base: (Usage, Usage),
    last: (Usage, Usage),
    next_interim: Instant,
    framed_v4: Option<Ipv4Addr>,
    framed_v6: Option<Ipv6Net>,
}

/// The sessions of one daemon.
pub struct Sessions {
    /// When the daemon started, Unix milliseconds: the first part of every session id.
    daemon_start: u64,
    started: u64,
    index: SessionIndex,
    interim: Duration,
    live: HashMap<String, Session>,
    /// Whether a scan was made: the sessions of the first are spread over the interval.
    scanned: bool,
}

fn usages(s: &Seen) -> (Usage, Usage) {
    (s.input.unwrap_or_default(), s.output.unwrap_or_default())
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
            live: HashMap::new(),
            scanned: false,
        }
    }

    pub fn len(&self) -> usize {
        self.live.len()
    }

    pub fn is_empty(&self) -> bool {
        self.live.is_empty()
    }

    /// The ids of `seen` without a session (or whose counts went back: set again): their
    /// prefixes are wanted by [`Self::update`].
    pub fn starting<'a>(&self, seen: &'a HashMap<String, Seen>) -> Vec<&'a str> {
        seen.iter()
            .filter(|(id, s)| self.live.get(*id).is_none_or(|l| went_back(l, s)))
            .map(|(id, _)| id.as_str())
            .collect()
    }

    fn record(
        &self,
        id: &str,
        s: &Session,
        status: Status,
        now: Instant,
        wall: SystemTime,
    ) -> Record {
        let (i, o) = s.last;
        Record {
            status,
            user: id.to_owned(),
            session_id: s.session_id.clone(),
            framed_v4: s.framed_v4,
            framed_v6: s.framed_v6,
            input: i.since(s.base.0),
            output: o.since(s.base.1),
            session_secs: u32::try_from(now.duration_since(s.started).as_secs())
                .unwrap_or(u32::MAX),
            cause: None,
            wall,
            made: now,
            server: None,
        }
    }

    /// The records of a scan that saw `seen` (every subscriber in force, by id) at `now`:
    /// Stop for each session gone (or set again: its counts went back), Start for each new
    /// one (its prefixes from `prefixes`), Interim for each due.
    pub fn update(
        &mut self,
        seen: &HashMap<String, Seen>,
        prefixes: &HashMap<String, Vec<IpNet>>,
        now: Instant,
        wall: SystemTime,
    ) -> Vec<Record> {
        let mut out = Vec::new();
        let gone: Vec<String> = self
            .live
            .iter()
            .filter(|(id, l)| seen.get(*id).is_none_or(|s| went_back(l, s)))
            .map(|(id, _)| id.clone())
            .collect();
        for id in gone {
            if let Some(s) = self.live.remove(&id) {
                self.index.remove(&s.session_id);
                let mut r = self.record(&id, &s, Status::Stop, now, wall);
                r.cause = Some(CAUSE_ADMIN_RESET);
                out.push(r);
            }
        }
        let mut new: Vec<&String> = seen
            .keys()
            .filter(|id| !self.live.contains_key(*id))
            .collect();
        new.sort();
        let n = u32::try_from(new.len()).unwrap_or(u32::MAX).max(1);
        for (k, id) in (0u32..).zip(new) {
            let base = usages(&seen[id]);
            // The first scan's sessions spread over the interval; later ones' interims
            // fall where they started.
            let first = match self.scanned {
                false => self.interim * (k + 1) / n,
                true => self.interim,
            };
            let (framed_v4, framed_v6) = framed(prefixes.get(id).map_or(&[][..], Vec::as_slice));
            self.started += 1;
            let s = Session {
                session_id: self.session_id(self.started),
                started: now,
                base,
                last: base,
                next_interim: now + first,
                framed_v4,
                framed_v6,
            };
            out.push(self.record(id, &s, Status::Start, now, wall));
            self.index.insert(&s.session_id, id);
            self.live.insert(id.clone(), s);
        }
        self.scanned = true;
        for (id, s) in &mut self.live {
            s.last = usages(&seen[id]);
        }
        let mut due = Vec::new();
        for (id, s) in &mut self.live {
            if s.next_interim <= now {
                // Due again one interval on, or from now if scans fell behind by more.
                s.next_interim = (s.next_interim + self.interim).max(now);
                due.push(id.clone());
            }
        }
        for id in due {
            let s = &self.live[&id];
            out.push(self.record(&id, s, Status::Interim, now, wall));
        }
        out
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
        live.iter()
            .map(|(id, s)| {
                self.index.remove(&s.session_id);
                let mut r = self.record(id, s, Status::Stop, now, wall);
                r.cause = Some(CAUSE_ADMIN_REBOOT);
                r
            })
            .collect()
    }
}

/// Whether a subscriber's counts are under its session's last: it was removed and set
/// again between two scans.
fn went_back(l: &Session, s: &Seen) -> bool {
    let (i, o) = usages(s);
    i.octets < l.last.0.octets || o.octets < l.last.1.octets
}

/// Every subscriber of `iface`'s attachments, with what each direction delivered, and
/// the tables read (for [`prefixes`]).
pub fn scan(
    iface: &str,
    netns: Option<&str>,
) -> Result<(HashMap<String, Seen>, Vec<SubscriberTable>), SubscriberError> {
    let mut seen: HashMap<String, Seen> = HashMap::new();
    let mut tables = Vec::new();
    for d in [Direction::Ingress, Direction::Egress] {
        let at = Attachment::toward(iface, netns, d);
        if !at.exists() {
            continue;
        }
        let table = SubscriberTable::of(&Pinned::open(&at)?)?;
        for c in table.all_counts()? {
            let u = Usage::of(&c);
            let s = seen.entry(c.id).or_default();
            match d {
                Direction::Ingress => s.input = Some(u),
                Direction::Egress => s.output = Some(u),
            }
        }
        tables.push(table);
    }
    Ok((seen, tables))
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
