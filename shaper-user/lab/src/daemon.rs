//! `shaper -n NS run -f FILE`, the daemon, as the tests drive it: its stderr in a log
//! file, its notifications on a datagram socket named by NOTIFY_SOCKET (a socket of the
//! test's, as systemd's would be), and its HTTP listeners scraped with curl in the lab's
//! namespace. Killed if still running when dropped.

use std::{
    fs,
    os::unix::net::UnixDatagram,
    path::{Path, PathBuf},
    process::{Child, Command, ExitStatus, Stdio},
    time::{Duration, Instant},
};

use crate::bins::shaper;

pub struct Daemon {
    pub child: Child,
    notify: UnixDatagram,
    dir: PathBuf,
}

impl Daemon {
    /// Starts it and waits for READY=1.
    pub fn start(ns: &str, file: &Path, more: &[&str]) -> Self {
        Self::start_with_env(ns, file, more, &[])
    }

    /// [`Daemon::start`] with `env` set for it alone (a crash point, ...).
    pub fn start_with_env(ns: &str, file: &Path, more: &[&str], env: &[(&str, &str)]) -> Self {
        let dir = scratch(&format!("daemon-{ns}"));
        // A path socket, not an abstract one: abstract sockets belong to a network
        // namespace, and the daemon enters the lab's.
        let socket = dir.join("notify");
        let notify = UnixDatagram::bind(&socket).unwrap();
        notify
            .set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        let log = fs::File::create(dir.join("log")).unwrap();
        let child = Command::new(shaper())
            .args(["-n", ns, "run", "-f"])
            .arg(file)
            .args(more)
            .env("NOTIFY_SOCKET", &socket)
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        let mut daemon = Daemon { child, notify, dir };
        daemon.wait_for("READY=1");
        daemon
    }

    /// Waits (10 s at most) for a notification holding `what`; panics with the log if
    /// the daemon exits or stays silent.
    pub fn wait_for(&mut self, what: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut buf = [0u8; 4096];
        while Instant::now() < deadline {
            if let Ok(n) = self.notify.recv(&mut buf) {
                let text = String::from_utf8_lossy(&buf[..n]).into_owned();
                if text.lines().any(|l| l == what) {
                    return text;
                }
            }
            if let Some(status) = self.child.try_wait().unwrap() {
                panic!("the daemon exited ({status}) before {what}: {}", self.log());
            }
        }
        panic!("no {what} from the daemon in 10 s: {}", self.log());
    }

    pub fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .args([&format!("-{signal}"), &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
    }

    /// SIGHUP, then the READY=1 that ends the reload; returns its STATUS line.
    pub fn reload(&mut self) -> String {
        self.signal("HUP");
        self.wait_for("RELOADING=1");
        self.wait_for("READY=1")
    }

    /// SIGTERM, and the exit status.
    pub fn stop(mut self) -> (ExitStatus, String) {
        self.signal("TERM");
        let status = self.child.wait().unwrap();
        (status, self.log())
    }

    pub fn log(&self) -> String {
        fs::read_to_string(self.dir.join("log")).unwrap_or_default()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// The workspace's root (the lab package is `shaper-user/lab`).
pub fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Runs `cargo xtask ARGS` in the workspace (`dist`, `image`), panicking with its output if
/// it fails; returns its standard output.
pub fn xtask(args: &[&str]) -> String {
    let out = Command::new("cargo")
        .arg("xtask")
        .args(args)
        .current_dir(workspace())
        .output()
        .expect("cargo");
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "cargo xtask {args:?}: {said}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    said
}

/// A fresh directory under the temporary directory, named after `tag` and this process.
pub fn scratch(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("shaper-{tag}-{}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).unwrap();
    dir
}

/// A file of one interface at `rate` with a 64k burst.
pub fn config(iface: &str, rate: &str) -> String {
    format!("[[interface]]\nname = \"{iface}\"\nrate = \"{rate}\"\nburst = \"64k\"\n")
}

/// What an HTTP GET in namespace `ns` answered: the status code and the body.
pub fn http_get(ns: &str, url: &str) -> (u16, String) {
    let out = Command::new("ip")
        .args(["netns", "exec", ns, "curl", "-sS", "--max-time", "5"])
        .args(["-w", "\n%{http_code}", url])
        .output()
        .expect("curl");
    assert!(
        out.status.success(),
        "curl {url}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let (body, code) = text.rsplit_once('\n').unwrap();
    (code.parse().unwrap(), body.to_owned())
}
