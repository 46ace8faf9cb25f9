//! The node's lifecycle journal through the native SDK: every sandbox's lifecycle in one
//! sequence, read after the sandbox is gone and after a daemon restart, filtered, and followed
//! as it happens.

use brig_sdk::{EventsRequest, SandboxOptions};
use brig_tests::{image, Daemon};

fn kinds(events: &[brig_sdk::LifecycleEvent]) -> Vec<&str> {
    events.iter().map(|e| e.event.as_str()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_journal_keeps_every_sandboxs_lifecycle_and_can_be_followed() {
    let mut daemon = Daemon::start().expect("brigd");
    let client = daemon.client().await.expect("connect");
    let mut follow = client.follow_events(0).await.expect("follow");

    let sb = client
        .create(SandboxOptions::container(&image("busybox")).label("job", "j1"))
        .await
        .expect("create");
    sb.pause().await.expect("pause");
    sb.resume().await.expect("resume");
    let id = sb.id().to_string();
    sb.destroy().await.expect("destroy");

    let of =
        |sandbox: &str| EventsRequest { sandbox: Some(sandbox.to_string()), ..Default::default() };
    let events = client.events(of(&id)).await.expect("events");
    assert_eq!(kinds(&events), ["created", "paused", "resumed", "destroyed"], "{events:?}");
    let created = &events[0];
    assert!(created.labels.contains(&("job".to_string(), "j1".to_string())), "{created:?}");
    assert_eq!(events[3].labels, created.labels, "a gone sandbox's events keep its labels");
    assert!(events[3].started_unix_ms > 0 && events[3].started_unix_ms <= events[3].unix_ms);
    assert!(events.windows(2).all(|w| w[0].seq < w[1].seq));

    // Followed as they happen: the same four, in order.
    let mut seen = Vec::new();
    while seen.len() < 4 {
        let batch = tokio::time::timeout(std::time::Duration::from_secs(10), follow.next_batch())
            .await
            .expect("an event within 10 s")
            .expect("stream")
            .expect("open");
        seen.extend(batch.into_iter().filter(|e| e.sandbox == id));
    }
    assert_eq!(kinds(&seen), ["created", "paused", "resumed", "destroyed"]);

    // Filtered by kind, and the newest first.
    let only = EventsRequest { events: vec!["paused".into()], ..of(&id) };
    assert_eq!(kinds(&client.events(only).await.expect("events")), ["paused"]);
    let newest = EventsRequest { limit: 1, newest_first: true, ..of(&id) };
    assert_eq!(kinds(&client.events(newest).await.expect("events")), ["destroyed"]);

    // Kept across a restart, and numbered on from where it was.
    let last = events[3].seq;
    daemon.restart().expect("restart");
    let client = daemon.client().await.expect("reconnect");
    assert_eq!(kinds(&client.events(of(&id)).await.expect("events")), kinds(&events));
    let next = client.create(SandboxOptions::fncall()).await.expect("create");
    let after = client.events(of(next.id())).await.expect("events");
    assert!(after[0].seq > last, "{after:?}");
    next.destroy().await.expect("destroy");
}
