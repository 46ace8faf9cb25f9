//! Conversion between wire messages and domain types, at the node's boundary.

use std::time::Duration;

use brig_core::{CallLimits, CallOutcome, CallReport, Tier, ToolCall};
use brig_fncall::workspace::{Entry, EntryKind};
use brig_fncall::{ToolSummary, ToolWorld};
use brig_proto as wire;

pub fn call_from_wire(call: wire::CallRequest) -> ToolCall {
    let l = call.limits;
    ToolCall {
        tool: call.tool,
        input: call.input,
        args: call.args,
        env: call.env,
        stdin: call.stdin,
        limits: CallLimits {
            timeout: l.timeout_ms.map(|ms| Duration::from_millis(ms.into())),
            memory_bytes: l.memory_mib.map(|m| u64::from(m) << 20),
            output_bytes: l.output_bytes.map(u64::from),
            fuel: l.fuel,
        },
    }
}

pub fn report_to_wire(report: CallReport) -> wire::CallResult {
    let outcome = match report.outcome {
        CallOutcome::Ok => wire::CallOutcome::Ok,
        CallOutcome::ToolError(m) => wire::CallOutcome::ToolError(m),
        CallOutcome::Exit(c) => wire::CallOutcome::Exit(c),
        CallOutcome::Timeout => wire::CallOutcome::Timeout,
        CallOutcome::OutOfMemory => wire::CallOutcome::OutOfMemory,
        CallOutcome::OutputOverflow => wire::CallOutcome::OutputOverflow,
        CallOutcome::FuelExhausted => wire::CallOutcome::FuelExhausted,
        CallOutcome::Trap(m) => wire::CallOutcome::Trap(m),
    };
    wire::CallResult {
        outcome,
        output: report.output,
        stdout: report.stdout,
        stderr: report.stderr,
        duration_us: u64::try_from(report.duration.as_micros()).unwrap_or(u64::MAX),
    }
}

pub fn tier_from_wire(tier: wire::Tier) -> Tier {
    match tier {
        wire::Tier::Fncall => Tier::Fncall,
        wire::Tier::Container => Tier::Container,
        wire::Tier::Microvm => Tier::Microvm,
        wire::Tier::Fullvm => Tier::Fullvm,
    }
}

pub fn tier_to_wire(tier: Tier) -> wire::Tier {
    match tier {
        Tier::Fncall => wire::Tier::Fncall,
        Tier::Container => wire::Tier::Container,
        Tier::Microvm => wire::Tier::Microvm,
        Tier::Fullvm => wire::Tier::Fullvm,
    }
}

pub fn entry_to_wire(e: Entry) -> wire::FileStat {
    wire::FileStat {
        path: e.path,
        kind: match e.kind {
            EntryKind::File => wire::FileKind::File,
            EntryKind::Dir => wire::FileKind::Dir,
            EntryKind::Symlink => wire::FileKind::Symlink,
            EntryKind::Other => wire::FileKind::Other,
        },
        size: e.size,
        mode: e.mode,
        modified_unix_ms: e.modified_unix_ms,
        uid: e.uid,
        gid: e.gid,
        metadata: e.metadata,
    }
}

pub fn tool_to_wire(t: ToolSummary) -> wire::ToolInfo {
    wire::ToolInfo {
        name: t.name,
        digest: t.digest,
        world: match t.world {
            ToolWorld::Tool => wire::ToolWorld::Tool,
            ToolWorld::Command => wire::ToolWorld::Command,
        },
        description: t.description,
        size_bytes: t.size_bytes,
    }
}

pub fn qos_from_wire(q: brig_proto::QosClass) -> brig_core::QosClass {
    match q {
        brig_proto::QosClass::LatencySensitive => brig_core::QosClass::LatencySensitive,
        brig_proto::QosClass::BestEffort => brig_core::QosClass::BestEffort,
    }
}

pub fn qos_to_wire(q: brig_core::QosClass) -> brig_proto::QosClass {
    match q {
        brig_core::QosClass::LatencySensitive => brig_proto::QosClass::LatencySensitive,
        brig_core::QosClass::BestEffort => brig_proto::QosClass::BestEffort,
    }
}
