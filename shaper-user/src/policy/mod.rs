//! Prefix policies: what an operator asks for ([`spec`]) and the maps that hold them
//! ([`table`]).

pub mod spec;
pub mod table;

pub use spec::{Action, Mode, PolicySpec, PrefixError, parse_prefix};
pub use table::{
    Changes, CheckedPolicy, Installed, PLAN_WINDOW, PolicyError, PolicySet, PolicyTable,
};
