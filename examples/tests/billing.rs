//! Runs the billing example end to end: SIGKILL after the charge and the
//! ledger commit, before the ack, must produce neither a second charge nor a
//! second ledger entry (PostgreSQL: `DATABASE_URL`, default local).

#[test]
fn billing_example_charges_each_invoice_once() {
    if queue_testkit::postgres::require().is_none() {
        return;
    }
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_billing"))
        .env_remove("REDIS_URL")
        .output()
        .expect("billing example runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("charges made:              5 (one per invoice: 5)"),
        "{stdout}"
    );
    assert!(stdout.contains("recovered by the watchdog: 5"), "{stdout}");
    assert!(
        stdout.contains("OK: no invoice was charged twice"),
        "{stdout}"
    );
    assert!(
        stdout.contains("ledger entries booked:     5 (one per invoice: 5)"),
        "{stdout}"
    );
    assert!(
        stdout.contains("redeliveries that found the inbox row done: 5"),
        "{stdout}"
    );
    assert!(
        stdout.contains("OK: no invoice was booked twice"),
        "{stdout}"
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("inbox: already done by an earlier delivery"),
        "the redelivery logs that it found the work done:\n{stderr}"
    );
}

/// Without PostgreSQL the example says what it needs and where it looked,
/// without the password, before starting anything else. Before, it ended
/// with the bare driver error ("error connecting to server: Connection
/// refused") after starting Redis and the payment API.
#[test]
fn billing_without_postgres_says_what_it_needs() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_billing"))
        .env(
            "DATABASE_URL",
            "postgres://billing:s3cret@127.0.0.1:1/ledger",
        )
        .env_remove("REDIS_URL")
        .output()
        .expect("billing example runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains(
            "billing needs PostgreSQL at postgres://billing@127.0.0.1:1/ledger (set DATABASE_URL): "
        ),
        "{stderr}"
    );
    assert!(!stderr.contains("s3cret"), "{stderr}");
}
