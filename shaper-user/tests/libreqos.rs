//! `shaper_user::libreqos`: LibreQoS `ShapedDevices.csv` files of our own, read into
//! circuits exactly, and malformed ones refused by line and column. Host only.

use ipnet::IpNet;
use shaper_user::libreqos::{self, Circuit, ImportError, MAX_ID_BYTES, MAX_ROW_BYTES, Rates};

const FILE: &str = include_str!("data/libreqos/shaped-devices.csv");

fn read(text: impl AsRef<[u8]>) -> Result<Vec<Circuit>, ImportError> {
    libreqos::read(text.as_ref())
}

fn nets(list: &[&str]) -> Vec<IpNet> {
    list.iter().map(|p| p.parse().unwrap()).collect()
}

fn rates(min_bps: u64, max_bps: u64) -> Rates {
    Rates { max_bps, min_bps }
}

/// What `shaped-devices.csv` holds, circuit by circuit.
fn expected() -> Vec<Circuit> {
    let circuit =
        |id: &str, name: Option<&str>, prefixes: &[&str], download, upload, line| Circuit {
            id: id.into(),
            name: name.map(Into::into),
            prefixes: nets(prefixes),
            download,
            upload,
            line,
        };
    vec![
        circuit(
            "c-101",
            Some("Ostrander, Flat 2"),
            &["100.70.1.10/32", "100.70.1.11/32", "fd10:20:30:100::/56"],
            rates(1_000_000, 120_000_000),
            rates(1_000_000, 24_000_000),
            5,
        ),
        circuit(
            "c-202",
            Some("Kaur & Sons \"Bakery\""),
            &["100.70.2.8/29", "fd10:20:40::/48"],
            rates(12_500_000, 250_750_000),
            rates(2_250_000, 50_125_000),
            7,
        ),
        // Three rows, the third after another circuit; 100.70.3.1 is listed twice.
        circuit(
            "c-303",
            Some("Mill Lane 7"),
            &[
                "100.70.3.1/32",
                "fd10:20:50:300::/56",
                "fd10:20:50:4ff::1/128",
                "100.70.3.2/32",
                "100.70.3.3/32",
            ],
            rates(500_000, 10_500_000),
            rates(250_000, 2_500_000),
            9,
        ),
        circuit(
            "c-404",
            Some("Quay Street"),
            &["100.70.4.4/32"],
            rates(1_000_000, 100_000_000),
            rates(1_000_000, 20_000_000),
            13,
        ),
        circuit(
            "c-505",
            None,
            &["fd10:20:60:500::/56"],
            rates(1_000, 1_000_000_001),
            rates(1_000, 999_999_999),
            16,
        ),
    ]
}

#[test]
fn every_case_of_the_format_reads_exactly() {
    let circuits = read(FILE).unwrap();
    assert_eq!(circuits, expected());
    assert_eq!(circuits[1].download.excess_bps(), 238_250_000);
}

/// The same file as Windows tools save it: CRLF line ends and a UTF-8 byte-order mark.
#[test]
fn crlf_and_a_byte_order_mark_read_the_same() {
    let windows = format!("\u{feff}{}", FILE.replace('\n', "\r\n"));
    assert!(windows.as_bytes().starts_with(&[0xef, 0xbb, 0xbf]));
    assert_eq!(read(&windows).unwrap(), expected());
    // And their lines are the file's lines: an error lands where it did.
    let broken = windows.replace("100.70.4.4", "100.70.4.400");
    assert_eq!(
        read(&broken).unwrap_err().to_string(),
        "line 13, column \"IPv4\": invalid address '100.70.4.400'"
    );
    let broken = FILE.replace("100.70.4.4", "100.70.4.400");
    assert_eq!(read(&broken).unwrap_err().line(), 13);
}

/// Columns by header name, in any order, under LibreQoS's other spellings; columns the
/// reader does not know are ignored; no `Circuit Name` column means no names.
#[test]
fn columns_are_found_by_name() {
    let text = "ipv6 , Upload_Max_Mbps,IPv4,circuit_id,download max,Download Min,UPLOAD MIN,Billing Plan\n\
                fd10:1::/48,5,\"100.70.9.1, 100.70.9.2\",x-1,50,1,0.5,gold\n";
    let circuits = read(text).unwrap();
    assert_eq!(
        circuits,
        [Circuit {
            id: "x-1".into(),
            name: None,
            prefixes: nets(&["100.70.9.1/32", "100.70.9.2/32", "fd10:1::/48"]),
            download: rates(1_000_000, 50_000_000),
            upload: rates(500_000, 5_000_000),
            line: 2,
        }]
    );
}

/// A header, a good row on line 2, and `row` on line 3.
fn with_row(row: &str) -> String {
    format!(
        "Circuit ID,Circuit Name,Device ID,Device Name,Parent Node,MAC,IPv4,IPv6,\
         Download Min Mbps,Upload Min Mbps,Download Max Mbps,Upload Max Mbps,Comment\n\
         g-1,Good,d-1,cpe,,,100.70.0.1,fd10::/56,1,1,100,20,\n\
         {row}\n"
    )
}

#[test]
fn malformed_rows_are_refused_by_line_and_column() {
    let cases = [
        (
            "b-1,Bad,d,cpe,,,10.0.0.300,,1,1,100,20,",
            "line 3, column \"IPv4\": invalid address '10.0.0.300'",
        ),
        (
            "b-1,Bad,d,cpe,,,100.70.5.0/33,,1,1,100,20,",
            "line 3, column \"IPv4\": invalid prefix '100.70.5.0/33'",
        ),
        (
            "b-1,Bad,d,cpe,,,100.70.5.0/+24,,1,1,100,20,",
            "line 3, column \"IPv4\": invalid prefix '100.70.5.0/+24'",
        ),
        (
            "b-1,Bad,d,cpe,,,,fd10::/,1,1,100,20,",
            "line 3, column \"IPv6\": invalid prefix 'fd10::/'",
        ),
        (
            "b-1,Bad,d,cpe,,,,fd10::/129,1,1,100,20,",
            "line 3, column \"IPv6\": invalid prefix 'fd10::/129'",
        ),
        (
            "b-1,Bad,d,cpe,,,100.70.5.1/24,,1,1,100,20,",
            "line 3, column \"IPv4\": '100.70.5.1/24' has host bits set (the prefix is \
             100.70.5.0/24)",
        ),
        (
            "b-1,Bad,d,cpe,,,,fd10:20:30:101::/56,1,1,100,20,",
            "line 3, column \"IPv6\": 'fd10:20:30:101::/56' has host bits set (the prefix is \
             fd10:20:30:100::/56)",
        ),
        (
            "b-1,Bad,d,cpe,,,,100.70.5.1,1,1,100,20,",
            "line 3, column \"IPv6\": '100.70.5.1' is IPv4: put it in the IPv4 column",
        ),
        (
            "b-1,Bad,d,cpe,,,fd10:5::1,,1,1,100,20,",
            "line 3, column \"IPv4\": 'fd10:5::1' is IPv6: put it in the IPv6 column",
        ),
        (
            "b-1,Bad,d,cpe,,,,::ffff:100.70.5.1,1,1,100,20,",
            "line 3, column \"IPv6\": '::ffff:100.70.5.1' is IPv4-mapped: put the IPv4 \
             address in the IPv4 column",
        ),
        (
            "b-1,Bad,d,cpe,,,\"100.70.5.1,\",,1,1,100,20,",
            "line 3, column \"IPv4\": an empty entry in the list (a comma too many?)",
        ),
        (
            "b-1,Bad,d,cpe,,,100.70.5.1 100.70.5.2,,1,1,100,20,",
            "line 3, column \"IPv4\": invalid address '100.70.5.1 100.70.5.2'",
        ),
        (
            ",Bad,d,cpe,,,100.70.5.1,,1,1,100,20,",
            "line 3, column \"Circuit ID\": empty: every row names its circuit (rows of one \
             Circuit ID are one subscriber)",
        ),
        (
            "b-1,Bad,d,cpe,,,100.70.5.1,,1,1,-100,20,",
            "line 3, column \"Download Max Mbps\": invalid rate '-100': negative",
        ),
        (
            "b-1,Bad,d,cpe,,,100.70.5.1,,1,2.0000001,100,20,",
            "line 3, column \"Upload Min Mbps\": invalid rate '2.0000001': finer than 1 bit/s \
             (at most 6 decimals of Mbps)",
        ),
        (
            "b-1,Bad,d,cpe,,,100.70.5.1,,1,1,100,NaN,",
            "line 3, column \"Upload Max Mbps\": invalid rate 'NaN': not a number",
        ),
        (
            "b-1,Bad,d,cpe,,,100.70.5.1,,1,1,100,,",
            "line 3, column \"Upload Max Mbps\": invalid rate '': empty (a rate in Mbps is \
             required)",
        ),
        (
            "b-1,Bad,d,cpe,,,100.70.5.1,,1,1,\"1,000\",20,",
            "line 3, column \"Download Max Mbps\": invalid rate '1,000': write the decimal \
             point as '.', with no thousands separator",
        ),
        (
            "b-1,Bad,d,cpe,,,100.70.5.1,,200,1,100,20,",
            "line 3, column \"Download Min Mbps\": 200 Mbps is above the Max of 100 Mbps (Min \
             cannot exceed Max)",
        ),
        (
            "b-1,Bad,d,cpe,,,100.70.5.1,,1,1,0,20,",
            "line 3, column \"Download Max Mbps\": invalid rate '0': zero",
        ),
        (
            "b-1,Bad,d,cpe,,,100.70.5.1,,1,1,100000001,20,",
            "line 3, column \"Download Max Mbps\": invalid rate '100000001': above shaper's \
             maximum of 100000000 Mbps",
        ),
        (
            "b-1,Bad,d,cpe,,,\"100.70.5.1, 100.70.0.1\",,1,1,100,20,",
            "line 3, column \"IPv4\": 100.70.0.1/32 is already in circuit 'g-1' (line 2): a \
             prefix belongs to one circuit",
        ),
        (
            "b-1,Bad,d,cpe,,,,FD10::/56,1,1,100,20,",
            "line 3, column \"IPv6\": fd10::/56 is already in circuit 'g-1' (line 2): a prefix \
             belongs to one circuit",
        ),
        (
            "g-1,Good,d-2,phone,,,100.70.0.2,,1,1,105,20,",
            "line 3, column \"Download Max Mbps\": '105' differs from '100' on line 2, the \
             first row of circuit 'g-1': rows of one Circuit ID must agree",
        ),
        (
            "g-1,Good,d-2,phone,,,100.70.0.2,,1,0.5,100,20,",
            "line 3, column \"Upload Min Mbps\": '0.5' differs from '1' on line 2, the first \
             row of circuit 'g-1': rows of one Circuit ID must agree",
        ),
        (
            "g-1,Other,d-2,phone,,,100.70.0.2,,1,1,100,20,",
            "line 3, column \"Circuit Name\": 'Other' differs from 'Good' on line 2, the first \
             row of circuit 'g-1': rows of one Circuit ID must agree",
        ),
        (
            "b-1,\"Bad,d,cpe,,,100.70.5.1,,1,1,100,20,\nb-2,Lost,d,cpe,,,100.70.5.2,,1,1,100,20,",
            "line 3, column \"Circuit Name\": a line break inside the cell (a quote left open?)",
        ),
        (
            "b-1,Bad,d,cpe,,,100.70.5.1,,1,1,100,20,\"note\nb-2,Lost,d,cpe,,,100.70.5.2,,1,1,100,20,",
            "line 3, column \"Comment\": a line break inside the cell (a quote left open?)",
        ),
        (
            "b-1,Bad,d,cpe,,,,,1,1,100,20,",
            "line 3, column \"IPv4\": circuit 'b-1' has no address in any row (IPv4 and IPv6 \
             empty): it would shape nothing",
        ),
        (
            "b\u{7}1,Bad,d,cpe,,,100.70.5.1,,1,1,100,20,",
            "line 3, column \"Circuit ID\": 'b\\u{7}1' holds a control character",
        ),
    ];
    for (row, error) in cases {
        assert_eq!(read(with_row(row)).unwrap_err().to_string(), error, "{row}");
    }
}

#[test]
fn cells_and_rows_are_bounded() {
    let id = "x".repeat(MAX_ID_BYTES);
    assert!(
        read(with_row(&format!(
            "{id},Bad,d,cpe,,,100.70.5.1,,1,1,100,20,"
        )))
        .is_ok()
    );
    let error = read(with_row(&format!(
        "{id}x,Bad,d,cpe,,,100.70.5.1,,1,1,100,20,"
    )))
    .unwrap_err()
    .to_string();
    assert!(
        error.starts_with(&format!(
            "line 3, column \"Circuit ID\": '{}…' is longer than 64 bytes",
            &id[..64]
        )),
        "{error}"
    );
    let comment = "c".repeat(MAX_ROW_BYTES);
    let error = read(with_row(&format!(
        "b-1,Bad,d,cpe,,,100.70.5.1,,1,1,100,20,{comment}"
    )));
    assert_eq!(
        error.unwrap_err().to_string(),
        "line 3: the row is longer than 65536 bytes"
    );
}

#[test]
fn a_name_that_is_not_utf8_is_refused() {
    let mut text = with_row("b-1,Caf\u{e9},d,cpe,,,100.70.5.1,,1,1,100,20,").into_bytes();
    // The é as Windows-1252 writes it: one byte, 0xe9.
    let at = text.windows(2).position(|w| w == "é".as_bytes()).unwrap();
    text.splice(at..at + 2, [0xe9]);
    assert_eq!(
        read(&text).unwrap_err().to_string(),
        "line 3, column \"Circuit Name\": 'Caf\u{fffd}' is not UTF-8: convert the file (iconv \
         -f WINDOWS-1252 -t UTF-8)"
    );
}

#[test]
fn headers_are_checked() {
    let cases: [(&str, &str); 6] = [
        (
            "",
            "line 1: no header row (the file is empty or all comments)",
        ),
        (
            "# only a comment\n\n",
            "line 1: no header row (the file is empty or all comments)",
        ),
        (
            "# a comment first\nCircuit ID,Circuit Name,IPv4,Download Min Mbps,Upload Min Mbps,\
             Download Max Mbps,Upload Max Mbps\n",
            "line 2, column \"IPv6\": missing from the header (the first row that is not a \
             comment names the columns)",
        ),
        (
            "Circuit ID,IPv4,IPv6,Download Min Mbps,Upload Min Mbps,Download Max Mbps,\
             Upload Max Mbps,ipv4\n",
            "line 1, column \"ipv4\": the header names IPv4 twice (columns 2 and 8)",
        ),
        // No header at all: the first row is taken as one, and names nothing we need.
        (
            "c-1,Name,d,cpe,,,100.70.5.1,,1,1,100,20,\n",
            "line 1, column \"Circuit ID\": missing from the header (the first row that is \
             not a comment names the columns)",
        ),
        // A 15-name header over 13-cell rows (LibreQoS's own example at 455bc13b is so):
        // by name, IPv4 is the 9th cell, here a rate.
        (
            "Circuit ID,Circuit Name,Device ID,Device Name,Parent Node,Parent Node ID,\
             Anchor Node ID,MAC,IPv4,IPv6,Download Min Mbps,Upload Min Mbps,Download Max Mbps,\
             Upload Max Mbps,Comment\n\
             c-1,Name,d,cpe,tower,,100.70.5.1,fd10::/56,1,1,100,20,\n",
            "line 2, column \"IPv4\": invalid address '1'",
        ),
    ];
    for (text, error) in cases {
        assert_eq!(read(text).unwrap_err().to_string(), error, "{text}");
    }
    // A header and no rows: no circuits.
    assert_eq!(read(with_row("").lines().next().unwrap()).unwrap(), []);
}

#[test]
fn utf16_is_refused() {
    let text: Vec<u8> = [0xff, 0xfe]
        .into_iter()
        .chain("Circuit ID".encode_utf16().flat_map(u16::to_le_bytes))
        .collect();
    assert_eq!(
        read(&text).unwrap_err().to_string(),
        "line 1: the file is UTF-16: convert it to UTF-8 first (iconv -f UTF-16 -t UTF-8)"
    );
}
