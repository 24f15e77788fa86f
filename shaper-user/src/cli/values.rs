//! The command line's spellings of the library's choices (clap value enums), and of its
//! settings (flags).

use shaper_user::{
    pins::Direction,
    policy::{Action, Mode},
    request::{Hook, KeyBy, XdpAttachMode},
    setting::Setting,
    tc::TcAttachMode,
};

/// How to attach the XDP program.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum XdpModeArg {
    /// Native if the driver supports it, otherwise generic (skb).
    Auto,
    /// In the driver; fails if the driver has no XDP support.
    Native,
    /// Generic XDP in the network stack; works on every interface, costs more.
    Skb,
}

impl From<XdpModeArg> for XdpAttachMode {
    fn from(m: XdpModeArg) -> Self {
        match m {
            XdpModeArg::Auto => Self::Auto,
            XdpModeArg::Native => Self::Native,
            XdpModeArg::Skb => Self::Skb,
        }
    }
}

/// Which traffic of an interface.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum DirectionArg {
    /// What it receives.
    Ingress,
    /// What it sends.
    Egress,
}

impl From<DirectionArg> for Direction {
    fn from(d: DirectionArg) -> Self {
        match d {
            DirectionArg::Ingress => Self::Ingress,
            DirectionArg::Egress => Self::Egress,
        }
    }
}

/// Where the program runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum HookArg {
    /// XDP, before the network stack: ingress only.
    Xdp,
    /// tc, on socket buffers: either direction (after GRO on ingress).
    Tc,
}

impl From<HookArg> for Hook {
    fn from(h: HookArg) -> Self {
        match h {
            HookArg::Xdp => Self::Xdp,
            HookArg::Tc => Self::Tc,
        }
    }
}

/// How to attach the tc program.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum TcModeArg {
    /// TCX where the kernel has it (6.6 and later), clsact otherwise.
    Auto,
    /// A TCX link (kernel 6.6 and later).
    Tcx,
    /// A cls_bpf filter on the clsact qdisc (added if absent, removed on detach if added).
    Clsact,
}

impl From<TcModeArg> for TcAttachMode {
    fn from(m: TcModeArg) -> Self {
        match m {
            TcModeArg::Auto => Self::Auto,
            TcModeArg::Tcx => Self::Tcx,
            TcModeArg::Clsact => Self::Clsact,
        }
    }
}

/// Which address of a frame picks its bucket.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum KeyArg {
    /// The source address: each sender (or sending network) gets its own bucket.
    Src,
    /// The destination address: each receiver (or receiving network) gets its own bucket.
    Dst,
}

impl From<KeyArg> for KeyBy {
    fn from(k: KeyArg) -> Self {
        match k {
            KeyArg::Src => Self::Src,
            KeyArg::Dst => Self::Dst,
        }
    }
}

/// What a policy does with its sources' packets.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ActionArg {
    /// Hold each source to the policy's rate and burst (and the prefix to its aggregate).
    Limit,
    /// Exempt: never limited, still counted.
    Pass,
    /// Blocked: every packet dropped.
    Drop,
}

impl From<ActionArg> for Action {
    fn from(a: ActionArg) -> Self {
        match a {
            ActionArg::Limit => Self::Limit,
            ActionArg::Pass => Self::Pass,
            ActionArg::Drop => Self::Drop,
        }
    }
}

/// Whether drops are carried out.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ModeArg {
    /// Drop what does not conform.
    Enforce,
    /// Dry run: drop nothing, count what enforcement would drop.
    Monitor,
    /// Egress only, with sch_fq: delay what does not conform until it does (ECN marks
    /// past --ecn-threshold, drops only past --horizon).
    Shape,
}

impl From<ModeArg> for Mode {
    fn from(m: ModeArg) -> Self {
        match m {
            ModeArg::Enforce => Self::Enforce,
            ModeArg::Monitor => Self::Monitor,
            ModeArg::Shape => Self::Shape,
        }
    }
}

/// The flag that sets `setting`: `--max-sources`.
pub fn flag(setting: Setting) -> String {
    format!("--{}", setting.name().replace('_', "-"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_are_named_by_their_flags() {
        assert_eq!(flag(Setting::MaxSources), "--max-sources");
        assert_eq!(flag(Setting::PrefixV4), "--prefix-v4");
        assert_eq!(flag(Setting::NewSourcesBurst), "--new-sources-burst");
    }
}
