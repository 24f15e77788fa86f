use super::{packet::tests::request, *};
use crate::subscriber::plan::MIN_BURST_BYTES;
use packet::{MESSAGE_AUTHENTICATOR, USER_NAME};

fn config() -> Config {
    Config {
        listen: "127.0.0.1:3799".parse().unwrap(),
        interface: "eth0".to_owned(),
        clients: vec![Client {
            address: "10.0.0.1".parse().unwrap(),
            secret: b"s3cret".to_vec(),
        }],
        identify: Identify::ALL.to_vec(),
        require_message_authenticator: false,
        require_event_timestamp: true,
        window: DEFAULT_WINDOW,
        rate: 3,
        burst_ns: DEFAULT_BURST_NS,
        plans: Default::default(),
        accounting: None,
    }
}

const FROM: &str = "10.0.0.1:40000";
const T0: u64 = 1_800_000_000;

fn wall(secs: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(secs)
}

fn coa(id: u8, stamp: u64, secret: &[u8], signed: bool) -> Vec<u8> {
    let stamp = u32::try_from(stamp).unwrap().to_be_bytes().to_vec();
    request(
        COA_REQUEST,
        id,
        &[(USER_NAME, b"c1".to_vec()), (EVENT_TIMESTAMP, stamp)],
        secret,
        signed,
    )
}

fn reason(s: &mut Server, from: &str, bytes: &[u8], now: Instant, at: u64) -> Option<Reason> {
    s.check(from.parse().unwrap(), bytes, now, wall(at))
        .err()
        .map(|o| o.reason)
}

#[test]
fn each_check_drops_what_it_guards() {
    let mut s = Server::new(config(), None);
    let now = Instant::now();
    let good = coa(1, T0, b"s3cret", true);
    assert_eq!(reason(&mut s, FROM, &good, now, T0), None);
    assert_eq!(
        reason(&mut s, "10.0.0.2:1", &good, now, T0),
        Some(Reason::UnknownClient)
    );
    assert_eq!(
        reason(&mut s, FROM, &coa(2, T0, b"wrong", false), now, T0),
        Some(Reason::BadAuthenticator)
    );
    // The whole packet re-signed after its Message-Authenticator was spoiled.
    let mut bad_mac = coa(3, T0, b"s3cret", true);
    let n = bad_mac.len();
    bad_mac[n - 1] ^= 1;
    packet::sign_request(&mut bad_mac, b"s3cret");
    assert_eq!(bad_mac[n - 18], MESSAGE_AUTHENTICATOR);
    let mut s = Server::new(config(), None);
    assert_eq!(
        reason(&mut s, FROM, &bad_mac, now, T0),
        Some(Reason::BadMessageAuthenticator)
    );
    assert_eq!(
        reason(&mut s, FROM, &coa(4, T0 - 301, b"s3cret", false), now, T0),
        Some(Reason::StaleEventTimestamp)
    );
    assert_eq!(
        reason(&mut s, FROM, &coa(5, T0 + 299, b"s3cret", false), now, T0),
        None
    );
}

#[test]
fn a_request_seen_is_answered_again_and_not_acted_on() {
    let mut s = Server::new(config(), None);
    let now = Instant::now();
    let good = coa(1, T0, b"s3cret", false);
    let checked = s
        .check(FROM.parse().unwrap(), &good, now, wall(T0))
        .unwrap();
    let reply = packet::reply(COA_ACK, &checked.packet, None, b"s3cret");
    let key = checked.key;
    s.seen.insert(key, (now, reply.clone()));
    let again = s
        .check(FROM.parse().unwrap(), &good, now, wall(T0))
        .err()
        .unwrap();
    assert_eq!((again.reason, again.reply), (Reason::Replay, Some(reply)));
    // Past the window it is forgotten, and its timestamp stale.
    let later = now + DEFAULT_WINDOW;
    assert_eq!(
        reason(&mut s, FROM, &good, later, T0 + 301),
        Some(Reason::StaleEventTimestamp)
    );
}

#[test]
fn required_attributes_and_the_rate_are_enforced() {
    let mut c = config();
    c.require_message_authenticator = true;
    let mut s = Server::new(c, None);
    let now = Instant::now();
    assert_eq!(
        reason(&mut s, FROM, &coa(1, T0, b"s3cret", false), now, T0),
        Some(Reason::MissingMessageAuthenticator)
    );
    let bare = request(
        COA_REQUEST,
        2,
        &[(USER_NAME, b"c1".to_vec())],
        b"s3cret",
        true,
    );
    assert_eq!(
        reason(&mut s, FROM, &bare, now, T0),
        Some(Reason::MissingEventTimestamp)
    );
    // Three a second: the fourth at once is over.
    assert_eq!(
        reason(&mut s, FROM, &coa(3, T0, b"s3cret", true), now, T0),
        None
    );
    assert_eq!(
        reason(&mut s, FROM, &coa(4, T0, b"s3cret", true), now, T0),
        Some(Reason::RateLimited)
    );
    let later = now + Duration::from_millis(400);
    assert_eq!(
        reason(&mut s, FROM, &coa(5, T0, b"s3cret", true), later, T0),
        None
    );
}

#[test]
fn a_new_rate_keeps_the_plan_shape() {
    let old = PolicyLimits {
        rate_bps: 30_000_000,
        burst_bytes: 96_000,
        aggregate_rate_bps: 20_000_000,
        aggregate_burst_bytes: 64_000,
        meter2: shaper_common::config::Meter2Limits {
            excess_rate_bps: 10_000_000,
            excess_burst_bytes: 32_000,
            ..Default::default()
        },
        ..PolicyLimits::default()
    };
    let new = new_plan(50_000_000, DEFAULT_BURST_NS)(&old);
    assert_eq!(
        (new.aggregate_rate_bps, new.aggregate_burst_bytes),
        (50_000_000, 125_000)
    );
    assert_eq!((new.rate_bps, new.burst_bytes), (60_000_000, 157_000));
    let mut own = old;
    own.rate_bps = 5_000_000;
    let kept = new_plan(1_000_000, DEFAULT_BURST_NS)(&own);
    assert_eq!(
        (kept.rate_bps, kept.aggregate_burst_bytes),
        (5_000_000, MIN_BURST_BYTES)
    );
}
