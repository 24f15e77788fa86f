//! `shaper apply`: bring every interface a configuration file names to what it says, as
//! one change. Everything is checked first (the file, then each interface and its MTU);
//! then the interfaces are changed one by one, and if one fails, those already changed
//! are put back: a new attachment is detached, an updated one gets its previous settings
//! and policies again.

use shaper_common::maps::Config;

use crate::{
    config_file::DesiredInterface,
    loader::{self, AdmissionRequest, AttachError, AttachRequest, Attached},
    pins::Attachment,
    policy::{PolicySpec, PolicyTable},
    system::{self, SystemError},
};

/// Ethernet header bytes counted in every frame on top of the MTU.
const ETH_HLEN: u32 = 14;

#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    #[error("interface {iface}: {source}")]
    System { iface: String, source: SystemError },
    #[error(
        "interface {iface}: {field} {burst} is smaller than one full-size frame ({frame} bytes), so such frames could never pass"
    )]
    BurstBelowFrame {
        iface: String,
        field: String,
        burst: u64,
        frame: u32,
    },
    #[error("interface {iface}: {source} (nothing was changed)")]
    Attach {
        iface: String,
        source: Box<AttachError>,
    },
}

/// What was done to one interface.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Applied {
    pub iface: String,
    pub outcome: Attached,
    pub policies: usize,
    /// False when an existing attachment already was as the file says.
    pub changed: bool,
}

/// How to put an interface back.
enum Undo {
    Detach(Attachment),
    Restore {
        at: Attachment,
        config: Config,
        policies: Vec<PolicySpec>,
    },
}

/// Checks what needs the interfaces themselves: that they exist, and that every burst
/// holds one full-size frame.
pub fn check_interfaces(desired: &[DesiredInterface]) -> Result<(), ApplyError> {
    for d in desired {
        let sys = |source| ApplyError::System {
            iface: d.name.clone(),
            source,
        };
        system::ifindex(&d.name).map_err(sys)?;
        let frame = system::mtu(&d.name).map_err(sys)? + ETH_HLEN;
        let mut bursts = vec![("burst".to_owned(), d.burst.bytes())];
        for p in &d.policies {
            for (what, bytes) in [
                ("burst", p.limits.burst_bytes),
                ("aggregate_burst", p.limits.aggregate_burst_bytes),
            ] {
                if bytes != 0 {
                    bursts.push((format!("policy {} {what}", p.prefix), bytes));
                }
            }
        }
        if let Some((field, burst)) = bursts.into_iter().find(|(_, b)| *b < u64::from(frame)) {
            return Err(ApplyError::BurstBelowFrame {
                iface: d.name.clone(),
                field,
                burst,
                frame,
            });
        }
    }
    Ok(())
}

/// Applies `desired` in the current network namespace (named `netns` in pin paths).
/// The caller holds the lock and has checked privileges and bpffs.
pub fn apply(
    desired: &[DesiredInterface],
    netns: Option<&str>,
) -> Result<Vec<Applied>, ApplyError> {
    check_interfaces(desired)?;
    let mut done: Vec<Undo> = Vec::new();
    let mut applied = Vec::new();
    for d in desired {
        let at = Attachment::new(&d.name, netns);
        let previous = if loader::is_live(&at) {
            Some(snapshot(&at).map_err(|e| attach_err(d, e))?)
        } else {
            None
        };
        let req = AttachRequest {
            at: at.clone(),
            rate_bps: d.rate.bits_per_sec(),
            burst_bytes: d.burst.bytes(),
            xdp_mode: d.xdp_mode,
            max_sources: d.max_sources,
            key: d.key,
            prefix_v4: d.prefix_v4,
            prefix_v6: d.prefix_v6,
            mode: Some(d.mode),
            admission: d
                .admission
                .map_or(AdmissionRequest::Default, AdmissionRequest::Exactly),
            policies: Some(d.policies.clone()),
        };
        match loader::attach(&req) {
            Ok(outcome) => {
                let changed = match &previous {
                    Some(before) => !snapshot(&at).is_ok_and(|after| same(before, &after)),
                    None => true,
                };
                done.push(match (outcome, previous) {
                    (Attached::Updated { .. }, Some((config, policies))) => Undo::Restore {
                        at,
                        config,
                        policies,
                    },
                    _ => Undo::Detach(at),
                });
                applied.push(Applied {
                    iface: d.name.clone(),
                    outcome,
                    policies: d.policies.len(),
                    changed,
                });
            }
            Err(e) => {
                roll_back(done);
                return Err(attach_err(d, e));
            }
        }
    }
    Ok(applied)
}

/// An attachment's settings and policies.
fn snapshot(at: &Attachment) -> Result<(Config, Vec<PolicySpec>), AttachError> {
    let table = PolicyTable::open(at)?;
    let config = table.config()?;
    let policies = table.list()?.into_iter().map(|i| i.spec).collect();
    Ok((config, policies))
}

/// Whether two snapshots hold the same settings and policies (the generation, which only
/// says how often the policies were written, aside).
fn same(a: &(Config, Vec<PolicySpec>), b: &(Config, Vec<PolicySpec>)) -> bool {
    let settings = |c: &Config| Config {
        policy_gen: 0,
        ..*c
    };
    settings(&a.0) == settings(&b.0) && a.1 == b.1
}

fn attach_err(d: &DesiredInterface, source: AttachError) -> ApplyError {
    ApplyError::Attach {
        iface: d.name.clone(),
        source: Box::new(source),
    }
}

/// Best effort, newest first: the error that caused it is the one worth reporting.
fn roll_back(done: Vec<Undo>) {
    for undo in done.into_iter().rev() {
        match undo {
            Undo::Detach(at) => {
                let _ = loader::detach(&at);
            }
            Undo::Restore {
                at,
                config,
                policies,
            } => {
                if let Ok(mut table) = PolicyTable::open(&at) {
                    let _ = table.set_config(&config);
                    let _ = table.replace_all(&policies);
                }
            }
        }
    }
}
