//! One TCP transfer from the first source to the receiver (IPv4 or IPv6), as fast as TCP
//! goes: large writes on a veth with TSO, so the sender's stack builds GSO packets of up to
//! 64 KiB.

use std::{
    io::{Read as _, Write as _},
    net::{IpAddr, SocketAddr, TcpListener, TcpStream},
    time::Duration,
};

use anyhow::{Context as _, Result, ensure};
use shaper_user::netns;

use super::Lab;

/// The receiver's port.
const PORT: u16 = 5201;
const WRITE_BYTES: usize = 256 * 1024;
const TIMEOUT: Duration = Duration::from_secs(30);

/// Sends `bytes` from the tx namespace to the receiver's address `dst` ([`Lab::rx_addr`],
/// or [`Lab::rx_addr6`] in a lab with IPv6) over TCP and waits until the receiver has
/// read them all and the connection is closed; returns the sender's address (the tx
/// veth's first address of the family, as routing picks it).
pub fn send_tcp_to(lab: &Lab, dst: IpAddr, bytes: usize) -> Result<IpAddr> {
    let rx = SocketAddr::new(dst, PORT);
    let listener = netns::run_in(lab.rx_ns(), move || TcpListener::bind(rx))?
        .with_context(|| format!("cannot listen on {rx}"))?;
    let reader = std::thread::spawn(move || -> Result<u64> {
        let (mut conn, _) = listener.accept()?;
        conn.set_read_timeout(Some(TIMEOUT))?;
        let mut buf = vec![0u8; WRITE_BYTES];
        let mut total = 0u64;
        loop {
            match conn.read(&mut buf)? {
                0 => return Ok(total),
                n => total += n as u64,
            }
        }
    });
    let mut conn = netns::run_in(lab.tx_ns(), move || {
        TcpStream::connect_timeout(&rx, TIMEOUT)
    })?
    .with_context(|| format!("cannot connect to {rx}"))?;
    let src = conn.local_addr()?.ip();
    conn.set_write_timeout(Some(TIMEOUT))?;
    let chunk = vec![0x5a_u8; WRITE_BYTES];
    let mut left = bytes;
    while left > 0 {
        let n = left.min(WRITE_BYTES);
        conn.write_all(&chunk[..n])?;
        left -= n;
    }
    conn.shutdown(std::net::Shutdown::Write)?;
    let read = reader
        .join()
        .map_err(|_| anyhow::anyhow!("the TCP reader panicked"))??;
    ensure!(
        read == bytes as u64,
        "sent {bytes} bytes over TCP, {read} arrived"
    );
    Ok(src)
}
