//! Runs the billing example end to end: SIGKILL after the charge, before the
//! ack, must not produce a second charge.

#[test]
fn billing_example_charges_each_invoice_once() {
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
}
