//! Fuzzes session tickets, which every client that resumes sends back:
//! `TicketKeys::open` on bytes as a client could send them must refuse
//! them (nothing but a sealed ticket opens, and nothing may panic); a
//! sealed state opens to the same bytes for its own listener only; and a
//! ticket changed in any one byte no longer opens.
//!
//! Input: one byte choosing the case, then the ticket or the state (and
//! for a tampered ticket, two bytes saying where and how to change it).

#![no_main]

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use tlsgate_config::SessionTickets;
use tlsgate_tls::tickets::{Quiet, TicketKeys};

fn keys() -> &'static Arc<TicketKeys> {
    static KEYS: OnceLock<Arc<TicketKeys>> = OnceLock::new();
    KEYS.get_or_init(|| {
        let policy = SessionTickets {
            enabled: true,
            tls13_count: 2,
            lifetime: Duration::from_secs(3600),
            rotation: Duration::from_secs(3600),
            key_file: None,
        };
        TicketKeys::with_clock(&policy, None, Arc::new(Quiet), Arc::new(|| 1_700_000_000)).unwrap()
    })
}

fuzz_target!(|data: &[u8]| {
    let Some((&case, rest)) = data.split_first() else {
        return;
    };
    let keys = keys();
    match case % 3 {
        0 => assert!(
            keys.open(b"listener-0", rest).is_err(),
            "a forged ticket opened"
        ),
        1 => {
            let sealed = keys.seal(b"listener-0", rest).expect("sealing works");
            assert_eq!(keys.open(b"listener-0", &sealed).as_deref(), Ok(rest));
            assert!(
                keys.open(b"listener-1", &sealed).is_err(),
                "opened for another listener"
            );
        }
        _ => {
            let Some((&[at, by], state)) = rest.split_first_chunk::<2>() else {
                return;
            };
            let mut sealed = keys.seal(b"listener-0", state).expect("sealing works");
            let at = usize::from(at) % sealed.len();
            sealed[at] ^= by.max(1);
            assert!(
                keys.open(b"listener-0", &sealed).is_err(),
                "a changed ticket opened"
            );
        }
    }
});
