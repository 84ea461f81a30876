//! `events -q Q [--follow]` and `queue events on|off -q Q`: a queue's event
//! stream (docs/EVENTS.md), printed one line (or JSON object) each.

use std::process::ExitCode;

use futures::StreamExt;
use queue_core::{EventsFrom, Queue, QueueEvent};

use crate::cli::{EventsArgs, QueueEventsArgs};
use crate::error::Result;
use crate::history_view::{event_json, event_line};

/// Turns the stream on or off, or prints whether it is on.
pub async fn switch(url: &str, args: QueueEventsArgs) -> Result<ExitCode> {
    let queue = Queue::connect(url).await?;
    let q = &args.queue;
    match args.switch.as_deref() {
        Some("on") => {
            queue.set_events_maxlen(q, args.maxlen.max(1)).await?;
            println!(
                "queue {q}: events on (stream capped at ~{})",
                args.maxlen.max(1)
            );
        }
        Some(_) => {
            queue.set_events(q, false).await?;
            println!("queue {q}: events off");
        }
        None => match queue.events_maxlen(q).await? {
            Some(n) => println!("queue {q}: events on (stream capped at ~{n})"),
            None => println!("queue {q}: events off"),
        },
    }
    Ok(ExitCode::SUCCESS)
}

fn print(e: &QueueEvent, json: bool) {
    if json {
        println!("{}", event_json(e));
    } else {
        println!("{}", event_line(e));
    }
}

/// Prints the last events, then follows new ones until SIGTERM / ctrl-c.
pub async fn events(url: &str, args: EventsArgs) -> Result<ExitCode> {
    let queue = Queue::connect(url).await?;
    if queue.events_maxlen(&args.queue).await?.is_none() {
        eprintln!(
            "note: events are off for queue {} (turn them on: queue events on -q {})",
            args.queue, args.queue
        );
    }
    let last = queue.last_events_page(&args.queue, args.last).await?;
    for e in &last.events {
        print(e, args.json);
    }
    if !args.follow {
        return Ok(ExitCode::SUCCESS);
    }
    // After the newest entry read, decoded or not. Before, from the newest
    // *decoded* one, and from the start when none of the last N decoded
    // (another writer's entries): the whole stream was printed again.
    let from = match last.next_after {
        Some(newest) => EventsFrom::After(newest),
        // The stream was empty: from its start, so that nothing added
        // between the two reads is missed.
        None if args.last > 0 => EventsFrom::Start,
        None => EventsFrom::Now,
    };
    let mut stream = queue.events(&args.queue, from).await?;
    let stop = super::termination();
    tokio::pin!(stop);
    loop {
        tokio::select! {
            _ = &mut stop => return Ok(ExitCode::SUCCESS),
            item = stream.next() => match item {
                Some(Ok(e)) => print(&e, args.json),
                Some(Err(e)) => eprintln!("events: {e} (retrying)"),
                None => return Ok(ExitCode::SUCCESS),
            },
        }
    }
}
