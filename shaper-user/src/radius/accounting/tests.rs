use super::*;

fn record(status: Status) -> Record {
    Record {
        status,
        user: "c1".to_owned(),
        session_id: "5F000000-00000001".to_owned(),
        framed_v4: Some(Ipv4Addr::new(100, 64, 0, 1)),
        framed_v6: Some("fdd7:b724:0:100::/56".parse().unwrap()),
        input: Usage {
            packets: 7,
            octets: 5 << 32 | 9,
        },
        output: Usage {
            packets: 1 << 32 | 3,
            octets: 11,
        },
        session_secs: 42,
        cause: None,
        wall: SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000),
        made: Instant::now(),
        server: None,
    }
}

fn nas() -> Nas {
    Nas {
        identifier: "bng1".to_owned(),
        ip: None,
    }
}

fn value(p: &[u8], kind: u8) -> Option<Vec<u8>> {
    super::super::packet::Packet::parse(p)
        .unwrap()
        .first(kind)
        .map(<[u8]>::to_vec)
}

fn int_of(p: &[u8], kind: u8) -> u32 {
    u32::from_be_bytes(value(p, kind).unwrap().try_into().unwrap())
}

#[test]
fn a_request_is_signed_as_rfc_2866_says_and_counts_carry_into_gigawords() {
    let p = encode(&record(Status::Interim), &nas(), 9, 2, b"k");
    assert_eq!((p[0], p[1]), (ACCOUNTING_REQUEST, 9));
    let mut zeroed = p.clone();
    zeroed[4..20].fill(0);
    let mut md5 = Md5::new();
    md5.update(&zeroed);
    md5.update(b"k");
    assert_eq!(&p[4..20], &md5.finalize()[..]);
    assert_eq!(int_of(&p, ACCT_STATUS_TYPE), 3);
    assert_eq!(int_of(&p, ACCT_INPUT_OCTETS), 9);
    assert_eq!(int_of(&p, ACCT_INPUT_GIGAWORDS), 5);
    assert_eq!(int_of(&p, ACCT_OUTPUT_PACKETS), 3, "packets wrap at 2^32");
    assert_eq!(int_of(&p, ACCT_OUTPUT_OCTETS), 11);
    assert_eq!(int_of(&p, ACCT_DELAY_TIME), 2);
    assert_eq!(int_of(&p, ACCT_SESSION_TIME), 42);
    assert_eq!(int_of(&p, EVENT_TIMESTAMP), 1_700_000_000);
    assert_eq!(value(&p, USER_NAME).unwrap(), b"c1");
    assert_eq!(value(&p, FRAMED_IP_ADDRESS).unwrap(), [100, 64, 0, 1]);
    assert_eq!(
        value(&p, FRAMED_IPV6_PREFIX).unwrap(),
        [0, 56, 0xfd, 0xd7, 0xb7, 0x24, 0, 0, 1]
    );
    // A Start carries no counts.
    let start = encode(&record(Status::Start), &nas(), 1, 0, b"k");
    assert_eq!(value(&start, ACCT_INPUT_OCTETS), None);
}

#[test]
fn a_response_is_checked_against_its_request_and_secret() {
    let req = encode(&record(Status::Start), &nas(), 4, 0, b"k");
    let mut resp = vec![ACCOUNTING_RESPONSE, 4, 0, 20];
    resp.extend_from_slice(&req[4..20]);
    let mut md5 = Md5::new();
    md5.update(&resp);
    md5.update(b"k");
    let auth = md5.finalize();
    resp[4..20].copy_from_slice(&auth);
    assert!(response_authentic(&resp, &req, b"k"));
    assert!(!response_authentic(&resp, &req, b"other"));
    let mut other_id = resp.clone();
    other_id[1] = 5;
    assert!(!response_authentic(&other_id, &req, b"k"));
}

/// `id` NUL-padded, as an entry holds it.
fn padded(id: &str) -> [u8; SUBSCRIBER_ID_BYTES] {
    let mut out = [0; SUBSCRIBER_ID_BYTES];
    out[..id.len()].copy_from_slice(id.as_bytes());
    out
}

fn usage(octets: u64) -> Usage {
    Usage {
        packets: octets / 100,
        octets,
    }
}

/// A scan at `now` that reads `entries` (index, id, input octets, output octets) on
/// both directions, the same index on each: its records.
fn scan(s: &mut Sessions, entries: &[(u32, &str, u64, u64)], now: Instant) -> Vec<Record> {
    s.begin();
    for &(i, id, input, output) in entries {
        s.saw(Direction::Ingress, i, &padded(id), usage(input));
        s.saw(Direction::Egress, i, &padded(id), usage(output));
    }
    let prefixes = s
        .starting()
        .into_iter()
        .map(|id| (id.to_owned(), vec!["100.64.0.1/32".parse().unwrap()]))
        .collect();
    s.end(&prefixes, now, SystemTime::now())
}

/// `(user, status, cause)` of each Start and Stop, in order.
fn what(out: &[Record]) -> Vec<(String, Status, Option<u32>)> {
    out.iter()
        .filter(|r| r.status != Status::Interim)
        .map(|r| (r.user.clone(), r.status, r.cause))
        .collect()
}

#[test]
fn sessions_start_spread_their_interims_and_stop() {
    let interim = Duration::from_secs(300);
    let index = SessionIndex::default();
    let mut s = Sessions::new(
        interim,
        SystemTime::UNIX_EPOCH + Duration::from_millis(0x05F0_0000_0123),
        index.clone(),
    );
    let t0 = Instant::now();
    let ids: Vec<String> = (0..100).map(|i| format!("c{i:03}")).collect();
    // Placed at indices in no order of their ids.
    let all: Vec<(u32, &str, u64, u64)> = ids
        .iter()
        .enumerate()
        .map(|(k, id)| (1 + (k as u32 * 37) % 100, id.as_str(), 1000, 2000))
        .collect();
    let out = scan(&mut s, &all, t0);
    assert_eq!(out.len(), 100);
    assert!(out.iter().all(|r| r.status == Status::Start));
    assert_eq!(out[0].session_id, "5F000000123-00000001");
    assert_eq!(out[0].user, "c000");
    assert_eq!(out[0].framed_v4, Some(Ipv4Addr::new(100, 64, 0, 1)));
    // The CoA listener finds each session's subscriber.
    assert_eq!(
        index.subscriber("5F000000123-00000001").as_deref(),
        Some("c000")
    );
    assert_eq!(
        index.subscriber("5F000000123-00000064").as_deref(),
        Some("c099")
    );
    assert_eq!(index.subscriber("5F000000123-00000065"), None);
    // Over the first interval, the first scan's sessions come due evenly: 10 a 30 s.
    let grown: Vec<(u32, &str, u64, u64)> = all
        .iter()
        .map(|&(i, id, _, _)| (i, id, 1500, 2100))
        .collect();
    for k in 1..=10u32 {
        let out = scan(&mut s, &grown, t0 + interim * k / 10);
        assert_eq!(out.len(), 10, "at {k}/10");
        assert!(out.iter().all(|r| r.status == Status::Interim));
        // Counted from Start.
        assert_eq!((out[0].input.octets, out[0].output.octets), (500, 100));
    }
    // c000 removed, c001 set again (its counts went back): Stop, and Stop then Start.
    let mut rest = grown.clone();
    rest.remove(0);
    rest[0].2 = 10;
    let out = scan(&mut s, &rest, t0 + interim * 11 / 10);
    let of = |id: &str| {
        out.iter()
            .filter(|r| r.user == id)
            .map(|r| (r.status, r.cause))
            .collect::<Vec<_>>()
    };
    assert_eq!(of("c000"), [(Status::Stop, Some(CAUSE_ADMIN_RESET))]);
    assert_eq!(
        of("c001"),
        [
            (Status::Stop, Some(CAUSE_ADMIN_RESET)),
            (Status::Start, None)
        ]
    );
    assert_eq!(what(&out).len(), 3);
    assert_eq!(s.len(), 99);
    // c000's session ended; c001's is a new one, counting from its new counts.
    assert_eq!(index.subscriber("5F000000123-00000001"), None);
    assert_eq!(index.subscriber("5F000000123-00000002"), None);
    assert_eq!(
        index.subscriber("5F000000123-00000065").as_deref(),
        Some("c001")
    );
    let mut more = rest.clone();
    more[0].2 = 50;
    let out = scan(&mut s, &more, t0 + interim * 23 / 10);
    let c001 = out.iter().find(|r| r.user == "c001").unwrap();
    assert_eq!(c001.input.octets, 40);
    let stops = s.stop_all(t0 + interim * 3, SystemTime::now());
    assert_eq!(stops.len(), 99);
    assert!(stops.iter().all(|r| r.cause == Some(CAUSE_ADMIN_REBOOT)));
    assert!(s.is_empty());
    assert_eq!(index.subscriber("5F000000123-00000065"), None);
}

/// A subscriber removed and another set at its index between two scans, its counts
/// higher (nothing went back): the old one's session stops, the new one's starts; and a
/// third set at the index the second left keeps the ids apart however the keys are
/// reused.
#[test]
fn another_subscriber_at_the_same_index_is_another_session() {
    let interim = Duration::from_secs(300);
    let index = SessionIndex::default();
    let mut s = Sessions::new(interim, SystemTime::UNIX_EPOCH, index.clone());
    let t0 = Instant::now();
    // Two scans: the second finds each at its index as the first left it.
    for _ in 0..2 {
        scan(&mut s, &[(1, "a", 10, 10), (2, "b", 10, 10)], t0);
    }
    let out = scan(&mut s, &[(1, "x", 900, 900), (2, "b", 20, 20)], t0);
    assert_eq!(
        what(&out),
        [
            ("a".to_owned(), Status::Stop, Some(CAUSE_ADMIN_RESET)),
            ("x".to_owned(), Status::Start, None)
        ]
    );
    let x = out[1].session_id.clone();
    assert_eq!(index.subscriber(&x).as_deref(), Some("x"));
    // x counts from its Start; b from its own.
    let out = scan(
        &mut s,
        &[(1, "x", 1000, 950), (2, "b", 30, 30)],
        t0 + interim * 2,
    );
    let of = |id: &str| out.iter().find(|r| r.user == id).unwrap().clone();
    assert_eq!(of("x").session_id, x);
    assert_eq!((of("x").input.octets, of("x").output.octets), (100, 50));
    assert_eq!(of("b").input.octets, 20);
    // b moves to index 1 as x leaves, y takes index 2: x stops, y starts, b goes on.
    let out = scan(
        &mut s,
        &[(1, "b", 40, 40), (2, "y", 5, 5)],
        t0 + interim * 2,
    );
    assert_eq!(
        what(&out),
        [
            ("x".to_owned(), Status::Stop, Some(CAUSE_ADMIN_RESET)),
            ("y".to_owned(), Status::Start, None)
        ]
    );
    assert_eq!(index.subscriber(&x), None);
    let out = scan(
        &mut s,
        &[(1, "b", 50, 50), (2, "y", 7, 7)],
        t0 + interim * 4,
    );
    let of = |id: &str| out.iter().find(|r| r.user == id).unwrap().clone();
    assert_eq!((of("b").input.octets, of("y").input.octets), (40, 2));
    assert_eq!(s.len(), 2);
}

/// A subscriber on one direction only: its other direction counts nothing; set on the
/// other too later, the same session goes on.
#[test]
fn a_subscriber_on_one_direction_is_one_session() {
    let interim = Duration::from_secs(300);
    let mut s = Sessions::new(interim, SystemTime::UNIX_EPOCH, SessionIndex::default());
    let t0 = Instant::now();
    let one = |s: &mut Sessions, d: Direction, i: u32, n: u64, now: Instant| {
        s.begin();
        s.saw(d, i, &padded("u"), usage(n));
        let prefixes = HashMap::new();
        s.end(&prefixes, now, SystemTime::now())
    };
    let out = one(&mut s, Direction::Egress, 3, 100, t0);
    assert_eq!(what(&out), [("u".to_owned(), Status::Start, None)]);
    let out = one(&mut s, Direction::Egress, 3, 400, t0 + interim);
    assert_eq!((out[0].input.octets, out[0].output.octets), (0, 300));
    // Gone from both: its Stop.
    s.begin();
    let out = s.end(&HashMap::new(), t0 + interim, SystemTime::now());
    assert_eq!(
        what(&out),
        [("u".to_owned(), Status::Stop, Some(CAUSE_ADMIN_RESET))]
    );
    assert!(s.is_empty());
}

/// Receives a request on `server` and answers it, signed for `secret`: the request.
fn answer(server: &UdpSocket, secret: &[u8]) -> Vec<u8> {
    let mut buf = [0u8; 4096];
    let (n, from) = server.recv_from(&mut buf).expect("a request");
    let request = buf[..n].to_vec();
    let mut response = vec![ACCOUNTING_RESPONSE, request[1], 0, 20];
    let mut md5 = Md5::new();
    md5.update(&response[..4]);
    md5.update(&request[4..20]);
    md5.update(secret);
    response.extend_from_slice(&md5.finalize());
    server.send_to(&response, from).unwrap();
    request
}

/// Whether `server` receives nothing within its read timeout.
fn quiet(server: &UdpSocket) -> bool {
    server.recv_from(&mut [0u8; 4096]).is_err()
}

#[test]
fn accounting_on_and_off_are_sent_alone_in_their_place() {
    let server = UdpSocket::bind("127.0.0.1:0").unwrap();
    server
        .set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    let config = Config {
        servers: vec![Server {
            address: server.local_addr().unwrap(),
            secret: b"s".to_vec(),
        }],
        interim: DEFAULT_INTERIM,
        timeout: Duration::from_secs(5),
        retries: 0,
        nas_identifier: "bng1".to_owned(),
        nas_ip_address: None,
    };
    let mut sender = Sender::new(config, nas()).unwrap();
    let start = SystemTime::UNIX_EPOCH + Duration::from_millis(0x0123_4567_89AB);
    let sessions = Sessions::new(DEFAULT_INTERIM, start, SessionIndex::default());
    let steps = |sender: &mut Sender| {
        for _ in 0..3 {
            sender.step(Instant::now() + Duration::from_millis(20));
        }
    };
    let (now, wall) = (Instant::now(), SystemTime::now());
    sender.queue(vec![
        sessions.accounting(Status::AccountingOn, now, wall),
        record(Status::Start),
        record(Status::Start),
    ]);
    steps(&mut sender);
    let on = answer(&server, b"s");
    assert_eq!(int_of(&on, ACCT_STATUS_TYPE), 7);
    assert_eq!(
        value(&on, ACCT_SESSION_ID).unwrap(),
        b"123456789AB-00000000"
    );
    assert_eq!(value(&on, NAS_IDENTIFIER).unwrap(), b"bng1");
    for absent in [
        USER_NAME,
        ACCT_INPUT_OCTETS,
        ACCT_SESSION_TIME,
        FRAMED_IP_ADDRESS,
    ] {
        assert_eq!(value(&on, absent), None, "attribute {absent}");
    }
    // No Start before the On's answer; both after it.
    assert!(
        quiet(&server),
        "a Start went before Accounting-On was answered"
    );
    steps(&mut sender);
    for _ in 0..2 {
        assert_eq!(int_of(&answer(&server, b"s"), ACCT_STATUS_TYPE), 1);
    }
    // The Off waits for the Stop's answer.
    sender.queue(vec![
        record(Status::Stop),
        sessions.accounting(Status::AccountingOff, now, wall),
    ]);
    steps(&mut sender);
    assert_eq!(int_of(&answer(&server, b"s"), ACCT_STATUS_TYPE), 2);
    assert!(
        quiet(&server),
        "Accounting-Off went before the Stop was answered"
    );
    steps(&mut sender);
    assert_eq!(int_of(&answer(&server, b"s"), ACCT_STATUS_TYPE), 8);
    steps(&mut sender);
    assert!(sender.idle());
}
