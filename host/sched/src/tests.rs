use super::*;

fn node(id: u32, memory_mib: u64, used_mib: u64) -> NodeView {
    NodeView {
        id: NodeId(id),
        healthy: true,
        tiers: vec![Tier::Fncall, Tier::Container],
        images: ImageAccess::Store,
        capacity: Resources { memory_mib, cpu_millis: 64_000, sandboxes: 10_000 },
        used: Resources { memory_mib: used_mib, ..Resources::default() },
    }
}

fn demand(mib: u64) -> Demand {
    Demand { tier: Tier::Container, image: None, memory_mib: mib, cpu_millis: 100 }
}

#[test]
fn same_seed_same_choices() {
    let nodes: Vec<_> = (0..20).map(|i| node(i, 1024, u64::from(i) * 10)).collect();
    let run = |seed| {
        let mut p = Placer::new(Strategy::PowerOfK(2), seed);
        (0..50)
            .map(|t| p.place(&nodes, &demand(1), &[], t).expect("place").node)
            .collect::<Vec<_>>()
    };
    assert_eq!(run(7), run(7));
    assert_ne!(run(7), run(8));
}

#[test]
fn k_equal_to_n_takes_the_least_loaded() {
    let nodes = vec![node(1, 1000, 900), node(2, 1000, 100), node(3, 1000, 500)];
    let mut p = Placer::new(Strategy::PowerOfK(3), 1);
    assert_eq!(p.place(&nodes, &demand(10), &[], 0).expect("place").node, NodeId(2));
}

#[test]
fn overlay_spreads_a_burst_between_heartbeats() {
    // Two equal nodes, no heartbeat during the burst: the overlay must alternate.
    let nodes = vec![node(1, 1000, 0), node(2, 1000, 0)];
    let mut p = Placer::new(Strategy::PowerOfK(2), 3);
    let mut counts = [0u32; 2];
    for t in 0..100 {
        let placed = p.place(&nodes, &demand(5), &[], t).expect("place");
        p.confirmed(placed, t);
        counts[(placed.node.0 - 1) as usize] += 1;
    }
    assert_eq!(counts, [50, 50]);
    assert_eq!(p.in_flight(NodeId(1)).sandboxes, 50);
    // A heartbeat received after the confirmations counts them: the overlay empties.
    p.heartbeat(NodeId(1), 200, 10_000);
    assert_eq!(p.in_flight(NodeId(1)), Resources::default());
    assert_eq!(p.in_flight(NodeId(2)).sandboxes, 50);
}

#[test]
fn refused_and_stale_placements_leave_the_overlay() {
    let nodes = vec![node(1, 1000, 0)];
    let mut p = Placer::new(Strategy::PowerOfK(2), 3);
    let a = p.place(&nodes, &demand(100), &[], 0).expect("a");
    let b = p.place(&nodes, &demand(100), &[], 0).expect("b");
    assert_eq!(p.in_flight(NodeId(1)).memory_mib, 200);
    p.refused(a);
    assert_eq!(p.in_flight(NodeId(1)).memory_mib, 100);
    // Never confirmed, and older than the staleness bound at the next heartbeat: dropped.
    p.heartbeat(NodeId(1), 60_000, 30_000);
    assert_eq!(p.in_flight(NodeId(1)).memory_mib, 0);
    let _ = b;
}

#[test]
fn filter_reports_why_nothing_fits() {
    let mut down = node(1, 1000, 0);
    down.healthy = false;
    let mut p = Placer::new(Strategy::PowerOfK(2), 1);
    let vm = Demand { tier: Tier::Microvm, ..demand(1) };
    assert_eq!(p.place(&[down.clone()], &vm, &[], 0), Err(PlaceError::NoTier(Tier::Microvm)));
    assert_eq!(
        p.place(&[down], &demand(1), &[], 0),
        Err(PlaceError::NoHealthyNode(Tier::Container))
    );
    let mut local = node(2, 1000, 0);
    local.images = ImageAccess::Only(vec!["busybox".into()]);
    let debian = Demand { image: Some("debian".into()), ..demand(1) };
    assert_eq!(
        p.place(std::slice::from_ref(&local), &debian, &[], 0),
        Err(PlaceError::NoImage("debian".into()))
    );
    let busybox = Demand { image: Some("busybox".into()), ..demand(1) };
    assert_eq!(
        p.place(std::slice::from_ref(&local), &busybox, &[], 0).map(|p| p.node),
        Ok(NodeId(2))
    );
    assert_eq!(p.place(&[node(3, 1000, 990)], &demand(20), &[], 0), Err(PlaceError::Full));
}

#[test]
fn excluded_nodes_are_skipped() {
    let nodes = vec![node(1, 1000, 0), node(2, 1000, 900)];
    let mut p = Placer::new(Strategy::PowerOfK(2), 1);
    let placed = p.place(&nodes, &demand(10), &[NodeId(1)], 0).expect("place");
    assert_eq!(placed.node, NodeId(2));
}
