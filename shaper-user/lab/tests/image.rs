//! The container image (`cargo xtask image`) under podman, in the lab: attached to the
//! lab's receiving interface (the container in that namespace, as a pod with
//! hostNetwork is in its node's), with only CAP_BPF, CAP_PERFMON and CAP_NET_ADMIN, a
//! read-only root and a bpffs of the test's own mounted at /sys/fs/bpf, it enforces the
//! file's rate; stopped, it leaves the limits in force, and started again it takes its
//! pins over (same program, counters kept), as a restarted pod of the DaemonSet does.
//! Then dist/kubernetes/'s DaemonSet pod template and ConfigMap, played by `podman kube
//! play` as a Pod, attach and serve /metrics on the node's address. What podman 4.3
//! cannot take is changed as the kubelet would have it: no port list and readiness probe
//! beside hostNetwork, the node's address for `status.podIP`, `$(VAR)` expanded in the
//! arguments, the seccomp profile as the annotation podman reads.
//!
//! podman runs with runc (this machine's cgroups are hybrid, which crun refuses) and
//! rlimits within the test's own (root here lacks CAP_SYS_RESOURCE): a containers.conf of
//! the test's, named by CONTAINERS_CONF.

#[expect(dead_code, reason = "not every helper is used here")]
mod common;

use std::{
    fs,
    path::PathBuf,
    process::{Command, Output},
    sync::OnceLock,
    time::{Duration, Instant},
};

use common::assert_near;
use serde_json::Value;
use shaper_lab::{
    daemon::{config, http_get, scratch, workspace, xtask},
    lab::{Flow, Lab, RX_ADDR, RunOptions, run_udp_with},
};

/// `localhost/shaper:VERSION`, built once per run by `cargo xtask image`.
fn image() -> &'static str {
    static IMAGE: OnceLock<String> = OnceLock::new();
    IMAGE.get_or_init(|| {
        let start = Instant::now();
        let said = xtask(&["image"]);
        let line = said
            .lines()
            .find(|l| l.starts_with("built localhost/"))
            .unwrap();
        println!("{line} in {:.0?}", start.elapsed());
        line.split_whitespace().nth(1).unwrap().to_owned()
    })
}

/// A scratch directory with the test's containers.conf and a bpffs mounted in it,
/// unmounted and removed on drop.
struct Scratch {
    dir: PathBuf,
}

impl Scratch {
    fn new(tag: &str) -> Self {
        let dir = scratch(tag);
        let nofile = rlimit(libc::RLIMIT_NOFILE);
        fs::write(
            dir.join("containers.conf"),
            format!(
                "[containers]\ndefault_ulimits = [\"nofile={nofile}:{nofile}\", \"nproc=4096:4096\"]\n\
                 [engine]\nruntime = \"runc\"\n"
            ),
        )
        .unwrap();
        fs::create_dir_all(dir.join("bpffs")).unwrap();
        fs::create_dir_all(dir.join("etc")).unwrap();
        let status = Command::new("mount")
            .args(["-t", "bpf", "bpf"])
            .arg(dir.join("bpffs"))
            .status()
            .unwrap();
        assert!(status.success());
        Scratch { dir }
    }

    fn podman(&self, args: &[&str]) -> Output {
        Command::new("podman")
            .args(args)
            .env("CONTAINERS_CONF", self.dir.join("containers.conf"))
            .output()
            .expect("podman (cargo xtask setup installs it)")
    }

    fn podman_ok(&self, args: &[&str]) -> String {
        let out = self.podman(args);
        assert!(
            out.status.success(),
            "podman {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(self.dir.join("bpffs")).status();
        let _ = fs::remove_dir_all(&self.dir);
    }
}

fn rlimit(resource: libc::__rlimit_resource_t) -> u64 {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit.
    assert_eq!(unsafe { libc::getrlimit(resource, &mut limit) }, 0);
    limit.rlim_max
}

/// A container removed (with its pod, if any) on drop.
struct Removed<'a> {
    scratch: &'a Scratch,
    args: Vec<String>,
}

impl Drop for Removed<'_> {
    fn drop(&mut self) {
        let args: Vec<&str> = self.args.iter().map(String::as_str).collect();
        let _ = self.scratch.podman(&args);
    }
}

/// Waits (20 s at most) for `what` in the container's log.
fn wait_for_log(scratch: &Scratch, name: &str, what: &str, times: usize) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let out = scratch.podman(&["logs", name]);
        let log = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        if log.matches(what).count() >= times {
            return log;
        }
        assert!(Instant::now() < deadline, "no {what} in 20 s: {log}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// `stats -j` read through the container (the pins are in its bpffs).
fn stats(scratch: &Scratch, name: &str, iface: &str) -> Value {
    let out = scratch.podman_ok(&["exec", name, "shaper", "-j", "stats", iface, "--top", "5"]);
    serde_json::from_str(&out).unwrap()
}

#[test]
#[ignore = "needs root: podman, XDP programs and network namespaces (cargo xtask test)"]
fn the_image_enforces_a_rate_and_survives_a_restart() {
    let image = image();
    let scratch = Scratch::new("image-run");
    let lab = Lab::new("img", 1).unwrap_or_else(|e| panic!("cannot create lab: {e:#}"));
    let iface = lab.rx_iface().to_owned();
    fs::write(scratch.dir.join("etc/shaper.toml"), config(&iface, "8mbit")).unwrap();
    let name = format!("shaper-test-{}", std::process::id());
    let _removed = Removed {
        scratch: &scratch,
        args: vec!["rm".into(), "-f".into(), name.clone()],
    };
    let netns = format!("ns:/run/netns/{}", lab.rx_ns());
    let bpffs = format!("{}:/sys/fs/bpf", scratch.dir.join("bpffs").display());
    let etc = format!("{}:/etc/shaper:ro", scratch.dir.join("etc").display());
    scratch.podman_ok(&[
        "run",
        "-d",
        "--name",
        &name,
        "--network",
        &netns,
        "--read-only",
        "--cap-drop=all",
        "--cap-add=CAP_BPF,CAP_PERFMON,CAP_NET_ADMIN",
        // As the DaemonSet: podman's default seccomp profile refuses bpf(2) without
        // CAP_SYS_ADMIN.
        "--security-opt",
        "seccomp=unconfined",
        "-v",
        &bpffs,
        "-v",
        &etc,
        image,
    ]);
    let log = wait_for_log(&scratch, &name, &format!("{iface} attached"), 1);
    println!("{log}");
    let program = lab.xdp_prog_id().unwrap().expect("attached");

    let src = lab.sources()[0];
    let flow = Flow {
        src: src.into(),
        offered_bps: 16_000_000,
        frame_bytes: 1000,
    };
    let report = run_udp_with(
        &lab,
        &[flow],
        Duration::from_secs(2),
        &RunOptions::default(),
    )
    .expect("traffic");
    let offered_secs = report.flows[0].offered_secs;
    let counted = stats(&scratch, &name, &iface);
    let passed = counted["totals"]["passed_bytes"].as_u64().unwrap();
    assert!(
        counted["totals"]["dropped_bytes"].as_u64().unwrap() > 0,
        "{counted}"
    );
    assert_near(
        "passed at 8mbit in the container",
        passed as f64,
        8e6 / 8.0 * offered_secs + 65_536.0,
        65_536.0,
    );

    // A restart, as a pod's: the limits stay while it is down, and the next one keeps
    // the program and every counter.
    scratch.podman_ok(&["stop", "-t", "10", &name]);
    let log = wait_for_log(&scratch, &name, "the limits stay in force", 1);
    assert_eq!(lab.xdp_prog_id().unwrap(), Some(program), "{log}");
    scratch.podman_ok(&["start", &name]);
    wait_for_log(&scratch, &name, &format!("{iface} unchanged"), 1);
    assert_eq!(lab.xdp_prog_id().unwrap(), Some(program));
    let again = stats(&scratch, &name, &iface);
    assert_eq!(
        again["totals"]["passed_bytes"],
        counted["totals"]["passed_bytes"]
    );
    let inspect = scratch.podman_ok(&["image", "inspect", "--format", "{{.Size}}", image]);
    println!("image {image}: {} bytes", inspect.trim());
}

/// dist/kubernetes/daemonset.yaml's pod template as a Pod, with the test's bpffs as its
/// hostPath; and configmap.yaml naming the lab's interface.
fn manifests(scratch: &Scratch, iface: &str) -> (PathBuf, PathBuf) {
    const SCRIPT: &str = r#"
import sys, yaml
src, bpffs, iface, node_ip, pod_out, cm_out = sys.argv[1:]
ds = yaml.safe_load(open(src + "/daemonset.yaml"))
tmpl = ds["spec"]["template"]
# podman 4.3 refuses a containerPort beside hostNetwork ("PortMappings can only be used
# with Bridge or slirp4netns networking"); Kubernetes takes it as information only.
for c in tmpl["spec"]["containers"]:
    c.pop("ports", None)
    c.pop("readinessProbe", None)
    # podman 4.3 has no status.podIP: the value the kubelet gives a hostNetwork pod.
    for e in c["env"]:
        if e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "status.podIP":
            del e["valueFrom"]
            e["value"] = node_ip
    # Nor does it expand $(VAR) in the arguments, as the kubelet does.
    # And it reads seccomp from the annotations of old, not from seccompProfile.
    if c["securityContext"]["seccompProfile"]["type"] == "Unconfined":
        key = "container.seccomp.security.alpha.kubernetes.io/" + c["name"]
        tmpl["metadata"]["annotations"][key] = "unconfined"
    env = {e["name"]: e["value"] for e in c["env"]}
    for k, v in env.items():
        c["args"] = [a.replace("$(%s)" % k, v) for a in c["args"]]
for v in tmpl["spec"]["volumes"]:
    if v["name"] == "bpffs":
        v["hostPath"]["path"] = bpffs
pod = {"apiVersion": "v1", "kind": "Pod",
       "metadata": {"name": ds["metadata"]["name"], "labels": tmpl["metadata"]["labels"],
                    "annotations": tmpl["metadata"]["annotations"]},
       "spec": tmpl["spec"]}
yaml.safe_dump(pod, open(pod_out, "w"))
cm = yaml.safe_load(open(src + "/configmap.yaml"))
cm["data"]["shaper.toml"] = cm["data"]["shaper.toml"].replace('"eth1"', '"%s"' % iface)
yaml.safe_dump(cm, open(cm_out, "w"))
"#;
    let (pod, cm) = (scratch.dir.join("pod.yaml"), scratch.dir.join("cm.yaml"));
    let out = Command::new("python3")
        .args(["-c", SCRIPT])
        .arg(workspace().join("dist/kubernetes"))
        .arg(scratch.dir.join("bpffs"))
        .arg(iface)
        .arg(RX_ADDR.to_string())
        .args([&pod, &cm])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    (pod, cm)
}

#[test]
#[ignore = "needs root: podman, XDP programs and network namespaces (cargo xtask test)"]
fn the_daemonset_pod_runs_under_podman_kube_play() {
    let image = image();
    let manifest = fs::read_to_string(workspace().join("dist/kubernetes/daemonset.yaml")).unwrap();
    assert!(
        manifest.contains(&format!("image: {image}\n")),
        "the DaemonSet does not name the image this tree builds ({image})"
    );
    let scratch = Scratch::new("image-kube");
    let lab = Lab::new("kube", 1).unwrap_or_else(|e| panic!("cannot create lab: {e:#}"));
    let iface = lab.rx_iface().to_owned();
    let (pod, cm) = manifests(&scratch, &iface);
    let pod_path = pod.to_str().unwrap().to_owned();
    let _removed = Removed {
        scratch: &scratch,
        args: vec!["kube".into(), "down".into(), pod_path.clone()],
    };
    // hostNetwork: the pod is in the namespace podman runs in, the lab's (nsenter, not
    // `ip netns exec`, which mounts a /sys without the cgroups podman makes the pod's in).
    let out = Command::new("nsenter")
        .arg(format!("--net=/run/netns/{}", lab.rx_ns()))
        .args(["podman", "kube", "play"])
        .args(["--configmap", cm.to_str().unwrap(), &pod_path])
        .env("CONTAINERS_CONF", scratch.dir.join("containers.conf"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "podman kube play: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let log = wait_for_log(&scratch, "shaper-shaper", &format!("{iface} attached"), 1);
    println!("{log}");
    assert!(lab.xdp_prog_id().unwrap().is_some());
    // /metrics on the node's (the lab's) address, from the other namespace, and no /top.
    let (code, body) = http_get(lab.tx_ns(), &format!("http://{RX_ADDR}:9753/metrics"));
    assert_eq!(code, 200, "{body}");
    assert!(
        body.contains(&format!("shaper_interface_attached{{interface=\"{iface}\"")),
        "{body}"
    );
    let (code, _) = http_get(
        lab.tx_ns(),
        &format!("http://{RX_ADDR}:9753/top?iface={iface}"),
    );
    assert_eq!(code, 404);
}
