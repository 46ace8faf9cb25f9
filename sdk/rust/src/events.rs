//! The node's lifecycle journal: every sandbox's lifecycle events in one sequence (what E2B's
//! events API and webhooks are made of).

use brig_proto::{EventsRequest, LifecycleEvent, Reply, Request, SandboxOp};
use brig_transport::ClientExchange;

use crate::client::unexpected;
use crate::{Client, Error};

impl Client {
    /// Lifecycle events this client's token sees, as `req` selects (one sandbox's, some
    /// kinds, after a point or the newest), oldest first.
    pub async fn events(&self, req: EventsRequest) -> Result<Vec<LifecycleEvent>, Error> {
        match self.request(&Request::Sandbox(SandboxOp::Events(req))).await? {
            Reply::Events(events) => Ok(events),
            other => Err(unexpected("events", &other)),
        }
    }

    /// Lifecycle events after `after_seq`, then each one as it happens.
    pub async fn follow_events(&self, after_seq: u64) -> Result<EventStream, Error> {
        let req = EventsRequest { after_seq, follow: true, ..Default::default() };
        let mut exchange = self.open(&Request::Sandbox(SandboxOp::Events(req))).await?;
        exchange.finish_upload()?;
        Ok(EventStream { exchange, done: false })
    }
}

/// Lifecycle events as the node sends them.
pub struct EventStream {
    exchange: ClientExchange,
    done: bool,
}

impl EventStream {
    /// The next batch of events; `None` at the end.
    pub async fn next_batch(&mut self) -> Result<Option<Vec<LifecycleEvent>>, Error> {
        crate::security::next_batch(&mut self.exchange, &mut self.done, "events", |reply| {
            match reply {
                Reply::Events(batch) => Ok(batch),
                other => Err(Box::new(other)),
            }
        })
        .await
    }
}
