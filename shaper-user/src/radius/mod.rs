//! RADIUS Dynamic Authorization (RFC 5176) for `shaper run`: a CoA-Request sets a
//! subscriber's plan from the rates it carries, a Disconnect-Request removes the
//! subscriber; each through the one change path ([`change::begin_edits`]), with the
//! pins and subscriber index it kept from its last change while nothing else changed the
//! attachments ([`change::Kept`]).
//!
//! A datagram goes through [`Server::check`], in this order, and is dropped unanswered
//! (counted by [`Reason`]) at the first check it fails: well formed ([`packet`]), from a
//! listed client, within that client's request rate, a CoA- or Disconnect-Request, its
//! Request Authenticator right for the client's secret, its Message-Authenticator right
//! when present (and present when required), its Event-Timestamp within the window of
//! now (and present when required), and not a replay: a request seen within the window
//! (same client, identifier and authenticator) is answered with the first one's reply
//! and changes nothing. Then [`Server::act`] finds the subscriber and changes it, and the
//! reply is an ACK or a NAK with the RFC's Error-Cause.

pub mod accounting;
pub mod packet;
pub mod request;

use std::{
    collections::{BTreeMap, HashMap, VecDeque},
    net::{IpAddr, SocketAddr},
    sync::{Arc, PoisonError, RwLock},
    time::{Duration, Instant, SystemTime},
};

use shaper_common::config::PolicyLimits;

use crate::{
    change::{self, ChangeError, Edit},
    pins::{Attachment, Direction},
    subscriber::{SubscriberError, plan},
    system,
};
use packet::{
    COA_ACK, COA_NAK, COA_REQUEST, DISCONNECT_ACK, DISCONNECT_NAK, DISCONNECT_REQUEST,
    EVENT_TIMESTAMP, Packet,
};
use request::{Identify, Refused, Target};

/// The port RFC 5176 assigns.
pub const DEFAULT_PORT: u16 = 3799;
/// The Event-Timestamp window by default: 300 s, as RFC 5176 §3.5's example.
pub const DEFAULT_WINDOW: Duration = Duration::from_secs(300);
/// Requests a second each client may send by default (and as many at once).
pub const DEFAULT_RATE: u32 = 100;
/// How long each rate's burst lasts by default: as `subscriber import`'s.
pub const DEFAULT_BURST_NS: u64 = 20_000_000;
/// The most requests remembered for replay detection: beyond it, a new request is
/// dropped (`replay_cache_full`) until older ones leave the window.
pub const MAX_REMEMBERED: usize = 65_536;
/// The most clients listed.
pub const MAX_CLIENTS: usize = 1024;
/// How long a request waits for the change lock before it is answered 506.
pub const LOCK_PATIENCE: Duration = Duration::from_secs(2);

/// A client allowed to send requests: its address and shared secret.
#[derive(Clone, PartialEq, Eq)]
pub struct Client {
    pub address: IpAddr,
    pub secret: Vec<u8>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Client {{ address: {}, secret: <hidden> }}",
            self.address
        )
    }
}

/// The `[radius]` table of the configuration file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    pub listen: SocketAddr,
    /// The interface whose subscribers a request changes: upload rates on its ingress
    /// attachment, download rates on its egress one.
    pub interface: String,
    pub clients: Vec<Client>,
    /// The attributes that may name the subscriber, in the order tried.
    pub identify: Vec<Identify>,
    pub require_message_authenticator: bool,
    pub require_event_timestamp: bool,
    pub window: Duration,
    /// Requests a second per client (and the burst).
    pub rate: u32,
    /// How long a burst lasts at its rate, nanoseconds.
    pub burst_ns: u64,
    /// The file's `[plan.NAME]` tables, which a `Filter-Id` names (read with the table;
    /// the listener takes them again at each reload: [`Plans`]).
    pub plans: BTreeMap<String, PolicyLimits>,
    /// `[radius.accounting]`: accounting to its servers, off without it.
    pub accounting: Option<accounting::Config>,
}

/// The plans a `Filter-Id` names, as the listener has them: the file's at start, and
/// the file's again after each reload applied ([`Plans::replace`]). Cloned, it is shared.
#[derive(Clone, Debug, Default)]
pub struct Plans(Arc<RwLock<BTreeMap<String, PolicyLimits>>>);

impl Plans {
    pub fn new(plans: BTreeMap<String, PolicyLimits>) -> Self {
        Self(Arc::new(RwLock::new(plans)))
    }

    /// The plan named `name`, if there is one.
    pub fn get(&self, name: &str) -> Option<PolicyLimits> {
        let plans = self.0.read().unwrap_or_else(PoisonError::into_inner);
        plans.get(name).copied()
    }

    /// From now on, `plans` are those a `Filter-Id` names.
    pub fn replace(&self, plans: BTreeMap<String, PolicyLimits>) {
        *self.0.write().unwrap_or_else(PoisonError::into_inner) = plans;
    }
}

/// Why a request was answered as it was, or dropped: the `reason` label of
/// `shaper_radius_requests_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Reason {
    /// ACK: the change was made.
    Ack,
    /// NAK 503: no such subscriber.
    SessionNotFound,
    /// NAK 402, 407: an attribute missing or invalid.
    MissingAttribute,
    InvalidAttribute,
    /// NAK 506: the change failed (lock busy, kernel maps), nothing changed.
    ResourcesUnavailable,
    /// Dropped, unanswered:
    Malformed,
    UnknownClient,
    RateLimited,
    UnsupportedCode,
    BadAuthenticator,
    BadMessageAuthenticator,
    MissingMessageAuthenticator,
    MissingEventTimestamp,
    StaleEventTimestamp,
    ReplayCacheFull,
    /// A request seen already: answered with its first reply, nothing changed.
    Replay,
}

impl Reason {
    pub const ALL: [Self; 16] = [
        Self::Ack,
        Self::SessionNotFound,
        Self::MissingAttribute,
        Self::InvalidAttribute,
        Self::ResourcesUnavailable,
        Self::Malformed,
        Self::UnknownClient,
        Self::RateLimited,
        Self::UnsupportedCode,
        Self::BadAuthenticator,
        Self::BadMessageAuthenticator,
        Self::MissingMessageAuthenticator,
        Self::MissingEventTimestamp,
        Self::StaleEventTimestamp,
        Self::ReplayCacheFull,
        Self::Replay,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Self::Ack => "ack",
            Self::SessionNotFound => "session_not_found",
            Self::MissingAttribute => "missing_attribute",
            Self::InvalidAttribute => "invalid_attribute",
            Self::ResourcesUnavailable => "resources_unavailable",
            Self::Malformed => "malformed",
            Self::UnknownClient => "unknown_client",
            Self::RateLimited => "rate_limited",
            Self::UnsupportedCode => "unsupported_code",
            Self::BadAuthenticator => "bad_authenticator",
            Self::BadMessageAuthenticator => "bad_message_authenticator",
            Self::MissingMessageAuthenticator => "missing_message_authenticator",
            Self::MissingEventTimestamp => "missing_event_timestamp",
            Self::StaleEventTimestamp => "stale_event_timestamp",
            Self::ReplayCacheFull => "replay_cache_full",
            Self::Replay => "replay",
        }
    }
}

/// A request's replay-cache key: its client's address, Identifier and Request
/// Authenticator.
type Key = (IpAddr, u8, [u8; 16]);

/// A request that passed every check: its packet and its client's secret.
pub struct Checked<'a> {
    pub packet: Packet<'a>,
    pub secret: Vec<u8>,
    /// Its replay-cache key, for [`Server::remember`].
    key: Key,
}

/// What became of a datagram: why, the reply to send (none: dropped), and a line for the
/// log.
#[derive(Debug)]
pub struct Outcome {
    pub reason: Reason,
    pub reply: Option<Vec<u8>>,
    pub detail: String,
}

/// A client's token bucket of requests.
struct Bucket {
    tokens: f64,
    at: Instant,
}

/// The listener's state: its configuration, each client's bucket, the requests seen
/// within the window.
pub struct Server {
    config: Config,
    netns: Option<String>,
    buckets: Vec<Bucket>,
    seen: HashMap<Key, (Instant, Vec<u8>)>,
    /// The keys of `seen` in the order remembered (oldest first), to forget them as they
    /// leave the window without going through them all.
    order: VecDeque<(Instant, Key)>,
    /// The pins and subscriber indexes of the `[radius]` interface's attachments, kept
    /// from one change to the next while nothing else changes them.
    kept: change::Kept,
    /// The accounting's sessions in progress, for a request naming one by
    /// Acct-Session-Id (none without `[radius.accounting]`).
    sessions: Option<accounting::SessionIndex>,
    /// The plans a `Filter-Id` names: `config.plans` at start, a reload's since.
    plans: Plans,
}

fn drop(reason: Reason, detail: impl Into<String>) -> Outcome {
    Outcome {
        reason,
        reply: None,
        detail: detail.into(),
    }
}

impl Server {
    pub fn new(config: Config, netns: Option<&str>) -> Self {
        let now = Instant::now();
        let buckets = config
            .clients
            .iter()
            .map(|_| Bucket {
                tokens: f64::from(config.rate),
                at: now,
            })
            .collect();
        Self {
            netns: netns.map(str::to_owned),
            buckets,
            seen: HashMap::new(),
            order: VecDeque::new(),
            kept: change::Kept::default(),
            sessions: None,
            plans: Plans::new(config.plans.clone()),
            config,
        }
    }

    /// Finds the subscriber of an Acct-Session-Id among the sessions `index` holds (the
    /// accounting's).
    pub fn with_sessions(self, index: accounting::SessionIndex) -> Self {
        Self {
            sessions: Some(index),
            ..self
        }
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The plans a `Filter-Id` names, shared: a reload replaces them.
    pub fn plans(&self) -> Plans {
        self.plans.clone()
    }

    /// Takes one token from client `i`'s bucket, if it has one.
    fn admit(&mut self, i: usize, now: Instant) -> bool {
        let rate = f64::from(self.config.rate.max(1));
        let b = &mut self.buckets[i];
        b.tokens = (b.tokens + now.duration_since(b.at).as_secs_f64() * rate).min(rate);
        b.at = now;
        if b.tokens >= 1.0 {
            b.tokens -= 1.0;
            true
        } else {
            false
        }
    }

    /// Every check of the module's order, a datagram from `from` received at `now`
    /// (`wall`: the clock Event-Timestamp is read against). `Err` is the outcome: dropped,
    /// or a replay answered with its first reply.
    pub fn check<'a>(
        &mut self,
        from: SocketAddr,
        datagram: &'a [u8],
        now: Instant,
        wall: SystemTime,
    ) -> Result<Checked<'a>, Outcome> {
        let p = Packet::parse(datagram).map_err(|e| drop(Reason::Malformed, e.to_string()))?;
        let addr = from.ip().to_canonical();
        let i = self
            .config
            .clients
            .iter()
            .position(|c| c.address == addr)
            .ok_or_else(|| drop(Reason::UnknownClient, "not a listed client"))?;
        if !self.admit(i, now) {
            return Err(drop(Reason::RateLimited, "over the client's request rate"));
        }
        if p.code != COA_REQUEST && p.code != DISCONNECT_REQUEST {
            return Err(drop(Reason::UnsupportedCode, format!("code {}", p.code)));
        }
        let secret = self.config.clients[i].secret.clone();
        if !p.request_authentic(&secret) {
            return Err(drop(
                Reason::BadAuthenticator,
                "wrong Request Authenticator (secret)",
            ));
        }
        match p.message_authentic(&secret) {
            Some(false) => {
                return Err(drop(
                    Reason::BadMessageAuthenticator,
                    "wrong Message-Authenticator",
                ));
            }
            None if self.config.require_message_authenticator => {
                return Err(drop(
                    Reason::MissingMessageAuthenticator,
                    "no Message-Authenticator",
                ));
            }
            _ => {}
        }
        self.check_timestamp(&p, wall)?;
        let key = (addr, p.identifier, p.authenticator);
        self.forget_before(now);
        if let Some((_, reply)) = self.seen.get(&key) {
            return Err(Outcome {
                reason: Reason::Replay,
                reply: Some(reply.clone()),
                detail: "seen within the window: its first reply sent again".to_owned(),
            });
        }
        if self.seen.len() >= MAX_REMEMBERED {
            return Err(drop(
                Reason::ReplayCacheFull,
                "too many requests within the window",
            ));
        }
        Ok(Checked {
            packet: p,
            secret,
            key,
        })
    }

    fn check_timestamp(&self, p: &Packet<'_>, wall: SystemTime) -> Result<(), Outcome> {
        let Some(v) = p.first(EVENT_TIMESTAMP) else {
            if self.config.require_event_timestamp {
                return Err(drop(Reason::MissingEventTimestamp, "no Event-Timestamp"));
            }
            return Ok(());
        };
        let stamp = <[u8; 4]>::try_from(v)
            .map(|b| u64::from(u32::from_be_bytes(b)))
            .map_err(|_| drop(Reason::StaleEventTimestamp, "Event-Timestamp not 4 octets"))?;
        let now = wall
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        if now.abs_diff(stamp) > self.config.window.as_secs() {
            return Err(drop(
                Reason::StaleEventTimestamp,
                format!(
                    "Event-Timestamp {stamp} is {}s from now",
                    now.abs_diff(stamp)
                ),
            ));
        }
        Ok(())
    }

    /// Forgets the requests seen a window or more before `now`.
    fn forget_before(&mut self, now: Instant) {
        while let Some((at, key)) = self.order.front().copied() {
            if now.duration_since(at) < self.config.window {
                break;
            }
            self.order.pop_front();
            if self.seen.get(&key).is_some_and(|(was, _)| *was == at) {
                self.seen.remove(&key);
            }
        }
    }

    /// Remembers `checked`'s reply for its replays, from `now`.
    pub fn remember(&mut self, checked: &Checked<'_>, reply: &[u8], now: Instant) {
        self.seen.insert(checked.key, (now, reply.to_vec()));
        self.order.push_back((now, checked.key));
    }

    /// Makes the change `checked` asks, and builds its reply: ACK, or NAK with its
    /// Error-Cause.
    pub fn act(&mut self, checked: &Checked<'_>) -> Outcome {
        let p = &checked.packet;
        let coa = p.code == COA_REQUEST;
        let (ack, nak) = match coa {
            true => (COA_ACK, COA_NAK),
            false => (DISCONNECT_ACK, DISCONNECT_NAK),
        };
        let reads = self.kept.reads();
        let (reason, cause, detail) = match self.change(p, coa) {
            Ok(detail) => (Reason::Ack, None, detail),
            Err((reason, cause, detail)) => (reason, Some(cause), detail),
        };
        let detail = match self.kept.reads() - reads {
            0 => detail,
            _ => detail + " (the subscribers read again: another change since the last request)",
        };
        let code = if cause.is_some() { nak } else { ack };
        Outcome {
            reason,
            reply: Some(packet::reply(code, p, cause, &checked.secret)),
            detail,
        }
    }

    fn attachment(&self, direction: Direction) -> Attachment {
        Attachment::toward(&self.config.interface, self.netns.as_deref(), direction)
    }

    /// Reads the subscribers of the interface's attachments into the index now, rather
    /// than at the first request: how many on each, or why not (the request reads them
    /// then). The change lock is held to begin (recover, open the pins, note the change
    /// count) and to check, not while the tables are read: an attachment another command
    /// changed meanwhile is read again, under the lock.
    pub fn prepare(&mut self) -> Result<Vec<(String, usize)>, String> {
        self.prepare_with(|| {})
    }

    /// [`Server::prepare`], running `meanwhile` after each attachment is read without the
    /// lock, before the check (a test's changes).
    pub fn prepare_with(
        &mut self,
        meanwhile: impl FnMut(),
    ) -> Result<Vec<(String, usize)>, String> {
        let ats: Vec<Attachment> = [Direction::Ingress, Direction::Egress]
            .into_iter()
            .map(|d| self.attachment(d))
            .filter(Attachment::exists)
            .collect();
        let lock = lock_within(LOCK_PATIENCE)?;
        let begun = change::begin_edits("radius start", &ats, lock, &mut self.kept)
            .map_err(|e| e.to_string())?;
        std::mem::drop(begun);
        self.kept.read_unlocked(&ats, meanwhile);
        let lock = lock_within(LOCK_PATIENCE)?;
        let mut begun = change::begin_edits("radius start", &ats, lock, &mut self.kept)
            .map_err(|e| e.to_string())?;
        ats.iter()
            .map(|at| Ok((at.label(), begun.indexed(at).map_err(|e| e.to_string())?)))
            .collect()
    }

    /// How many times an attachment's subscribers were read whole into the index.
    pub fn index_reads(&self) -> u64 {
        self.kept.reads()
    }

    /// The change itself; `Err` is the NAK's reason, Error-Cause and detail.
    fn change(&mut self, p: &Packet<'_>, coa: bool) -> Result<String, (Reason, u32, String)> {
        let refused = |r: Refused| {
            let reason = match r {
                Refused::Missing(_) => Reason::MissingAttribute,
                Refused::Invalid(_) => Reason::InvalidAttribute,
            };
            (reason, r.error_cause(), r.to_string())
        };
        let not_found = |what: String| (Reason::SessionNotFound, 503, what);
        let target = match request::target(p, &self.config.identify).map_err(refused)? {
            Target::Session(session) => Target::Id(
                self.sessions
                    .as_ref()
                    .and_then(|s| s.subscriber(&session))
                    .ok_or_else(|| not_found(format!("no accounting session {session:?}")))?,
            ),
            target => target,
        };
        let asked = match coa {
            true => Some(self.asked(p).map_err(refused)?),
            false => None,
        };
        let unavailable = |e: ChangeError| (Reason::ResourcesUnavailable, 506, e.to_string());
        let what = if coa {
            "radius coa"
        } else {
            "radius disconnect"
        };
        let attachments: Vec<Placed> = [Direction::Ingress, Direction::Egress]
            .into_iter()
            .map(|d| (d, self.attachment(d)))
            .filter(|(_, at)| at.exists())
            .collect();
        let ats: Vec<Attachment> = attachments.iter().map(|(_, at)| at.clone()).collect();
        let waited = Instant::now();
        let lock =
            lock_within(LOCK_PATIENCE).map_err(|e| (Reason::ResourcesUnavailable, 506, e))?;
        let waited = waited.elapsed();
        let mut begun =
            change::begin_edits(what, &ats, lock, &mut self.kept).map_err(unavailable)?;
        let (id, found) = find(&mut begun, &attachments, &target)
            .map_err(unavailable)?
            .ok_or_else(|| not_found(format!("no subscriber {target:?}")))?;
        type Plan = Box<dyn Fn(&PolicyLimits) -> PolicyLimits>;
        let burst_ns = self.config.burst_ns;
        let rate = |r: Option<u64>| r.map(|r| Box::new(new_plan(r, burst_ns)) as Plan);
        let (up, down): (Option<Plan>, Option<Plan>) = match &asked {
            Some(Asked::Plan(_, plan)) => {
                let plan = *plan;
                (Some(Box::new(move |_| plan)), Some(Box::new(move |_| plan)))
            }
            Some(Asked::Rates(r)) => (rate(r.up), rate(r.down)),
            None => (None, None),
        };
        let edits: Vec<(Attachment, Edit<'_>)> = found
            .into_iter()
            .filter_map(|(d, at)| {
                let plan = match d {
                    Direction::Ingress => up.as_ref(),
                    Direction::Egress => down.as_ref(),
                };
                match (coa, plan) {
                    (false, _) => Some((at, Edit::Del { id: id.clone() })),
                    (true, Some(plan)) => Some((
                        at,
                        Edit::Plan {
                            id: id.clone(),
                            plan,
                        },
                    )),
                    (true, None) => None,
                }
            })
            .collect();
        if edits.is_empty() {
            return Err(not_found(format!(
                "subscriber {id} is not on the direction of the rates given"
            )));
        }
        let waited = match waited >= Duration::from_millis(1) {
            true => format!(" (waited {waited:.1?} for the change lock)"),
            false => String::new(),
        };
        match begun.apply(&edits) {
            Ok(_) => Ok(describe(&id, coa, asked.as_ref()) + &waited),
            Err(ChangeError::Subscriber(SubscriberError::NotFound(id))) => {
                Err(not_found(format!("no subscriber {id}")))
            }
            Err(e) => Err(unavailable(e)),
        }
    }

    /// The plan a CoA asks: the file's plan its `Filter-Id` names, or the rates of its
    /// other attributes.
    fn asked(&self, p: &Packet<'_>) -> Result<Asked, Refused> {
        let Some(name) = request::filter_id(p)? else {
            return request::rates(p).map(Asked::Rates);
        };
        match self.plans.get(&name) {
            Some(plan) => Ok(Asked::Plan(name, plan)),
            None => Err(Refused::Invalid(format!(
                "Filter-Id '{name}' names no plan of the file"
            ))),
        }
    }
}

/// An attachment of the `[radius]` interface, with its direction.
type Placed = (Direction, Attachment);

/// The id of the subscriber `target` names and the attachments (of `attachments`) it is
/// set on, looking on the ingress attachment first: through the daemon's index, or one
/// lookup in the tries for a prefix.
fn find(
    begun: &mut change::Edits<'_>,
    attachments: &[Placed],
    target: &Target,
) -> Result<Option<(String, Vec<Placed>)>, ChangeError> {
    let mut id: Option<String> = None;
    let mut found = Vec::new();
    for (d, at) in attachments {
        let hit = match (&id, target) {
            (Some(id), _) | (None, Target::Id(id)) => begun.has(at, id)?.then(|| id.clone()),
            (None, Target::Prefix(net)) => begun.id_holding(at, net)?,
            // Found among the accounting's sessions before.
            (None, Target::Session(_)) => None,
        };
        if let Some(hit) = hit {
            id.get_or_insert(hit);
            found.push((*d, at.clone()));
        }
    }
    Ok(id.map(|id| (id, found)))
}

/// `coa c1042: up 10000000 bit/s, down 20000000 bit/s`.
fn describe(id: &str, coa: bool, asked: Option<&Asked>) -> String {
    let r = match asked.filter(|_| coa) {
        None => return format!("disconnect {id}: removed"),
        Some(Asked::Plan(name, _)) => return format!("coa {id}: plan {name}"),
        Some(Asked::Rates(r)) => r,
    };
    let show = |r: Option<u64>| r.map_or_else(|| "unchanged".to_owned(), |r| format!("{r} bit/s"));
    format!("coa {id}: up {}, down {}", show(r.up), show(r.down))
}

/// What a CoA asks: a plan of the file by name (`Filter-Id`), or rates.
enum Asked {
    Plan(String, PolicyLimits),
    Rates(request::Rates),
}

/// What a CoA's `rate_bps` makes of a plan in force: the subscriber's rate and a burst
/// lasting `burst_ns` at it (at least 16 KiB, as `subscriber import`); the per-address
/// limit follows when it was the subscriber's own (plus the excess rate), and is kept
/// otherwise; the excess rate, DSCP and mode are kept ([`plan::with_rate`]).
fn new_plan(rate_bps: u64, burst_ns: u64) -> impl Fn(&PolicyLimits) -> PolicyLimits {
    move |old: &PolicyLimits| plan::with_rate(old, rate_bps, burst_ns)
}

/// The change lock within `patience`, tried every 20 ms.
fn lock_within(patience: Duration) -> Result<system::Lock, String> {
    let deadline = Instant::now() + patience;
    loop {
        match system::try_lock() {
            Ok(Some(lock)) => return Ok(lock),
            Ok(None) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(20));
            }
            Ok(None) => {
                return Err(format!(
                    "{} held by another command for over {patience:?}",
                    system::LOCK_PATH
                ));
            }
            Err(e) => return Err(e.to_string()),
        }
    }
}

#[cfg(test)]
mod tests;
