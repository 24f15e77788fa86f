//! The worked examples of docs/operating/policies.md and colour.md are `examples/isp.toml`
//! and `examples/profile.toml`, word for word, and they are valid configurations (host
//! only: nothing is applied).

use shaper_user::{
    config_file,
    pins::Direction,
    policy::{Action, PolicySet, PolicySpec},
    request::AdmissionRequest,
};

const EXAMPLE: &str = include_str!("../../../examples/isp.toml");
const POLICIES: &str = include_str!("../../../docs/operating/policies.md");
const PROFILE: &str = include_str!("../../../examples/profile.toml");
const COLOUR: &str = include_str!("../../../docs/operating/colour.md");

#[test]
fn the_docs_show_the_example_file_verbatim() {
    assert!(
        POLICIES.contains(&format!("```toml\n{EXAMPLE}```")),
        "docs/operating/policies.md's worked example differs from examples/isp.toml"
    );
}

#[test]
fn the_example_is_valid_and_says_what_its_comments_say() {
    let interfaces = config_file::parse("examples/isp.toml", EXAMPLE, Direction::Ingress).unwrap();
    assert_eq!(interfaces.len(), 1);
    let eth1 = &interfaces[0];
    assert_eq!(eth1.rate.rate_bps(), 10_000_000);
    let AdmissionRequest::Exactly(admission) = eth1.admission else {
        panic!("the example sets new_sources: {:?}", eth1.admission);
    };
    assert_eq!(
        (admission.new_sources, admission.new_sources_burst),
        (2000, 100_000)
    );
    let policies: Vec<PolicySpec> = eth1
        .policies
        .iter()
        .flat_map(PolicySet::specs)
        .copied()
        .collect();
    let actions: Vec<(String, Action)> = policies
        .iter()
        .map(|p| (p.prefix.to_string(), p.action()))
        .collect();
    assert_eq!(
        actions,
        [
            ("192.0.2.0/28".to_owned(), Action::Pass),
            ("2001:db8:bad::/48".to_owned(), Action::Drop),
            ("198.51.100.0/24".to_owned(), Action::Limit),
        ]
    );
    // The business customer: one subscriber over both families, its plan named.
    let parsed = config_file::parse_file("examples/isp.toml", EXAMPLE, Direction::Ingress).unwrap();
    let business = parsed.plans()["business"];
    assert_eq!(
        (business.aggregate_rate_bps, business.rate_bps),
        (10_000_000, 4_000_000)
    );
    let subscribers = &eth1.subscribers.as_ref().unwrap();
    assert!(!subscribers.prune);
    let b203 = &subscribers.specs[0];
    assert_eq!(
        b203.prefixes
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>(),
        ["203.0.113.0/24", "2001:db8:203::/48"]
    );
    assert_eq!(b203.plan, business);
    assert_eq!(eth1.max_subscribers, Some(1000));
}

#[test]
fn the_bandwidth_profile_example_is_shown_verbatim_and_says_what_it_says() {
    assert!(
        COLOUR.contains(&format!("```toml\n{PROFILE}```")),
        "docs/operating/colour.md's example differs from examples/profile.toml"
    );
    let interfaces =
        config_file::parse("examples/profile.toml", PROFILE, Direction::Ingress).unwrap();
    let eth1 = &interfaces[0];
    let m = eth1.meter2;
    assert_eq!(
        (m.excess_rate_bps, m.excess_burst_bytes, m.excess_dscp),
        (10_000_000, 65_536, 8)
    );
    assert_eq!((m.packet_rate, m.packet_burst), (20_000, 2_000));
    let policy = eth1
        .policies
        .iter()
        .flat_map(PolicySet::specs)
        .next()
        .unwrap();
    let m = policy.limits.meter2;
    // Lower Effort, DSCP 1, when the file names no mark.
    assert_eq!(
        (m.excess_rate_bps, m.excess_dscp, m.packet_rate),
        (50_000_000, 1, 0)
    );
}
