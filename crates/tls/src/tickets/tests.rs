use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use super::*;

/// A clock the test moves by hand.
#[derive(Clone, Default)]
struct Hand(Arc<AtomicU64>);

impl Hand {
    fn at(t: u64) -> Self {
        let h = Self::default();
        h.0.store(t, Ordering::SeqCst);
        h
    }
    fn advance(&self, secs: u64) {
        self.0.fetch_add(secs, Ordering::SeqCst);
    }
    fn clock(&self) -> Clock {
        let c = self.0.clone();
        Arc::new(move || c.load(Ordering::SeqCst))
    }
}

/// Counts what the observer hears.
#[derive(Default)]
struct Counts {
    issued: AtomicUsize,
    ok: AtomicUsize,
    expired: AtomicUsize,
    unknown: AtomicUsize,
    invalid: AtomicUsize,
    keys: AtomicUsize,
    reload_ok: AtomicUsize,
    reload_err: AtomicUsize,
    rotated: AtomicUsize,
}

impl TicketObserver for Counts {
    fn issued(&self) {
        self.issued.fetch_add(1, Ordering::SeqCst);
    }
    fn opened(&self, r: Result<(), Refused>) {
        match r {
            Ok(()) => &self.ok,
            Err(Refused::Expired) => &self.expired,
            Err(Refused::UnknownKey) => &self.unknown,
            Err(Refused::Invalid) => &self.invalid,
        }
        .fetch_add(1, Ordering::SeqCst);
    }
    fn key_count(&self, n: usize) {
        self.keys.store(n, Ordering::SeqCst);
    }
    fn reloaded(&self, ok: bool) {
        if ok {
            &self.reload_ok
        } else {
            &self.reload_err
        }
        .fetch_add(1, Ordering::SeqCst);
    }
    fn rotated(&self) {
        self.rotated.fetch_add(1, Ordering::SeqCst);
    }
}

fn n(c: &AtomicUsize) -> usize {
    c.load(Ordering::SeqCst)
}

fn policy(lifetime: u64, rotation: u64, key_file: Option<PathBuf>) -> SessionTickets {
    SessionTickets {
        enabled: true,
        tls13_count: 2,
        lifetime: Duration::from_secs(lifetime),
        rotation: Duration::from_secs(rotation),
        key_file,
    }
}

fn memory(lifetime: u64, rotation: u64, hand: &Hand) -> (Arc<TicketKeys>, Arc<Counts>) {
    let counts = Arc::new(Counts::default());
    let keys = TicketKeys::with_clock(
        &policy(lifetime, rotation, None),
        None,
        counts.clone(),
        hand.clock(),
    )
    .unwrap();
    (keys, counts)
}

const STATE: &[u8] = b"session state: master secret and friends";
const CX: &[u8] = b"listener[0]";

#[test]
fn roundtrip_through_the_rustls_interface() {
    let hand = Hand::at(1_000_000);
    let (keys, counts) = memory(3600, 3600, &hand);
    let t = keys.for_listener("listener[0]");
    assert!(t.enabled());
    assert_eq!(t.lifetime(), 3600);
    let ticket = t.encrypt(STATE).unwrap();
    assert_eq!(ticket.len(), STATE.len() + seal::OVERHEAD);
    assert_eq!(t.decrypt(&ticket).unwrap(), STATE);
    // Fresh nonce per ticket: the same state never seals the same way.
    assert_ne!(t.encrypt(STATE).unwrap(), ticket);
    assert_eq!(n(&counts.issued), 2);
    assert_eq!(n(&counts.ok), 1);
    assert_eq!(n(&counts.keys), 1);
}

#[test]
fn no_ticket_is_sealed_for_an_unreachable_peer() {
    let hand = Hand::at(1_000_000);
    let (keys, counts) = memory(3600, 3600, &hand);
    let t = keys.for_listener("listener[0]");
    {
        let _gone = crate::session_cache::UnreachablePeer::enter();
        assert!(t.encrypt(STATE).is_none());
    }
    assert_eq!(n(&counts.issued), 0);
    assert!(t.encrypt(STATE).is_some());
    assert_eq!(n(&counts.issued), 1);
}

#[test]
fn another_key_or_listener_cannot_open() {
    let hand = Hand::at(1_000_000);
    let (a, _) = memory(3600, 3600, &hand);
    let (b, counts) = memory(3600, 3600, &hand);
    let ticket = a.seal(CX, STATE).unwrap();
    assert_eq!(b.open(CX, &ticket), Err(Refused::UnknownKey));
    assert_eq!(n(&counts.unknown), 1);
    // Same key, other listener: the context is authenticated.
    assert_eq!(a.open(b"listener[1]", &ticket), Err(Refused::Invalid));
    assert!(a.for_listener("listener[1]").decrypt(&ticket).is_none());
    assert_eq!(a.open(CX, &ticket).unwrap(), STATE);
}

#[test]
fn any_tampering_is_refused_and_nothing_panics() {
    let hand = Hand::at(1_000_000);
    let (keys, counts) = memory(3600, 3600, &hand);
    let ticket = keys.seal(CX, STATE).unwrap();
    for i in 0..ticket.len() {
        for bit in [0x01u8, 0x80] {
            let mut bad = ticket.clone();
            bad[i] ^= bit;
            let r = keys.open(CX, &bad);
            let want = if i < seal::NAME_LEN {
                Refused::UnknownKey
            } else {
                Refused::Invalid
            };
            assert_eq!(r, Err(want), "byte {i} bit {bit:#x}");
        }
    }
    // Truncated, extended, empty, huge: refused.
    for len in 0..ticket.len() {
        assert!(keys.open(CX, &ticket[..len]).is_err(), "length {len}");
    }
    let mut longer = ticket.clone();
    longer.push(0);
    assert_eq!(keys.open(CX, &longer), Err(Refused::Invalid));
    let huge = vec![0u8; seal::MAX_TICKET_LEN + 1];
    assert_eq!(keys.open(CX, &huge), Err(Refused::Invalid));
    assert_eq!(n(&counts.ok), 0);
    assert_eq!(keys.open(CX, &ticket).unwrap(), STATE);
}

#[test]
fn expiry_is_sealed_in_the_ticket() {
    let hand = Hand::at(1_000_000);
    // Rotation far away: only the sealed time can expire the ticket.
    let (keys, counts) = memory(60, 86_400, &hand);
    let ticket = keys.seal(CX, STATE).unwrap();
    hand.advance(60);
    assert_eq!(
        keys.open(CX, &ticket).unwrap(),
        STATE,
        "exactly the lifetime"
    );
    hand.advance(1);
    assert_eq!(keys.open(CX, &ticket), Err(Refused::Expired));
    assert_eq!(n(&counts.expired), 1);
    // A ticket stamped well in the future (a wrong clock) is refused too.
    let future = Hand::at(1_000_000 + 3600);
    let skewed = TicketKeys {
        clock: future.clock(),
        observer: Arc::new(Quiet),
        ring: ArcSwap::new(keys.ring.load_full()),
        lifetime: 60,
        source: Source::Memory { rotation: 86_400 },
        refreshing: Mutex::new(()),
    };
    let from_future = skewed.seal(CX, STATE).unwrap();
    assert_eq!(keys.open(CX, &from_future), Err(Refused::Invalid));
    // A little skew between fleet members is fine.
    let near = Hand::at(1_000_000 + 61 + 30);
    let skewed = TicketKeys {
        clock: near.clock(),
        ..skewed
    };
    let from_near = skewed.seal(CX, STATE).unwrap();
    assert_eq!(keys.open(CX, &from_near).unwrap(), STATE);
}

#[test]
fn in_memory_rotation_keeps_old_keys_for_a_lifetime() {
    let hand = Hand::at(1_000_000);
    let (keys, counts) = memory(100, 30, &hand);
    let t0 = keys.seal(CX, STATE).unwrap();
    keys.refresh();
    assert_eq!(keys.key_count(), 1, "not due yet");
    hand.advance(30);
    keys.refresh();
    assert_eq!(keys.key_count(), 2);
    assert_eq!(n(&counts.rotated), 1);
    let t30 = keys.seal(CX, STATE).unwrap();
    assert_ne!(t0[..seal::NAME_LEN], t30[..seal::NAME_LEN], "new key seals");
    assert_eq!(keys.open(CX, &t0).unwrap(), STATE, "old key still opens");
    for _ in 0..3 {
        hand.advance(30);
        keys.refresh();
    }
    // t = 120: keys since 0 (retired 30), 30, 60, 90, 120.
    assert_eq!(keys.key_count(), 5);
    assert_eq!(n(&counts.keys), 5);
    // t0 expired at 100 anyway; t30 still good.
    assert_eq!(keys.open(CX, &t0), Err(Refused::Expired));
    assert_eq!(keys.open(CX, &t30).unwrap(), STATE);
    hand.advance(11);
    keys.refresh();
    // t = 131: the first key retired at 30 + 100 < 131 is gone; the
    // second is kept, though its ticket of t = 30 has just expired.
    assert_eq!(keys.key_count(), 4);
    assert_eq!(keys.open(CX, &t0), Err(Refused::UnknownKey));
    assert_eq!(keys.open(CX, &t30), Err(Refused::Expired));
    // Steady state: about lifetime / rotation + 1 keys.
    for _ in 0..20 {
        hand.advance(30);
        keys.refresh();
    }
    assert!(keys.key_count() <= 5, "{}", keys.key_count());
    // A rotation far shorter than the lifetime: the ring stays bounded.
    let (keys, _) = memory(86_400, 1, &hand);
    for _ in 0..(file::MAX_KEYS + 10) {
        hand.advance(1);
        keys.refresh();
    }
    assert_eq!(keys.key_count(), file::MAX_KEYS);
}

#[test]
fn key_file_first_encrypts_all_decrypt_and_reload_on_change() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("keys");
    file::generate(&path, 1, false).unwrap();
    let hand = Hand::at(1_000_000);
    let counts = Arc::new(Counts::default());
    let p = policy(3600, 3600, Some(path.clone()));
    let a = TicketKeys::with_clock(&p, None, counts.clone(), hand.clock()).unwrap();
    let b = TicketKeys::with_clock(&p, None, Arc::new(Quiet), hand.clock()).unwrap();
    let old = a.seal(CX, STATE).unwrap();
    assert_eq!(b.open(CX, &old).unwrap(), STATE, "a fleet shares keys");

    file::rotate(&path, 2).unwrap();
    a.refresh();
    assert_eq!(n(&counts.reload_ok), 1);
    assert_eq!(a.key_count(), 2);
    let new = a.seal(CX, STATE).unwrap();
    assert_ne!(old[..seal::NAME_LEN], new[..seal::NAME_LEN]);
    assert_eq!(a.open(CX, &old).unwrap(), STATE);
    a.refresh();
    assert_eq!(n(&counts.reload_ok), 1, "unchanged file: not read again");

    // Broken file: the keys stay, the failure is reported once.
    std::fs::write(&path, "tlsgate-ticket-keys v1\nnot a key\n").unwrap();
    a.refresh();
    a.refresh();
    assert_eq!(n(&counts.reload_err), 1);
    assert_eq!(a.key_count(), 2);
    assert_eq!(a.open(CX, &new).unwrap(), STATE);
    // Too open: refused on reload as at start.
    file::generate(&path, 1, true).unwrap();
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
    a.refresh();
    assert_eq!(n(&counts.reload_err), 2);
    let e = TicketKeys::new(&p, None, Arc::new(Quiet)).unwrap_err();
    assert!(e.to_string().contains(&*path.to_string_lossy()), "{e}");
    // Gone: reported, keys stay.
    std::fs::remove_file(&path).unwrap();
    a.refresh();
    assert_eq!(n(&counts.reload_err), 3);
    assert_eq!(a.open(CX, &new).unwrap(), STATE);
    // Back, without the old keys: their tickets stop resuming.
    file::generate(&path, 1, false).unwrap();
    a.refresh();
    assert_eq!(n(&counts.reload_ok), 2);
    assert_eq!(a.key_count(), 1);
    assert_eq!(a.open(CX, &new), Err(Refused::UnknownKey));
}

#[test]
fn debug_never_shows_key_material() {
    let secret = Secret::from_bytes([0xAB; 32]);
    let key = TicketKey::derive(&secret, 0).unwrap();
    let text = format!("{key:?}");
    assert!(!text.to_lowercase().contains("abab"), "{text}");
    let hand = Hand::at(1);
    let (keys, _) = memory(10, 10, &hand);
    let text = format!("{keys:?} {:?}", keys.for_listener("listener[0]"));
    assert!(text.contains("keys: 1"), "{text}");
    assert!(!text.contains("aead"), "{text}");
}

/// A clock set back a day does not keep one key sealing for a day more:
/// the key is replaced at once, and the next rotation comes on time.
#[test]
fn a_clock_set_back_rotates_the_key_at_once() {
    let hand = Hand::at(1_000_000);
    let (keys, counts) = memory(3600, 600, &hand);
    let before = keys.seal(CX, STATE).unwrap();
    hand.0.fetch_sub(86_400, Ordering::SeqCst);
    keys.refresh();
    assert_eq!(n(&counts.rotated), 1);
    let after = keys.seal(CX, STATE).unwrap();
    // Another key seals now: the key name, the first bytes, differs.
    assert_ne!(before[..16], after[..16]);
    hand.advance(599);
    keys.refresh();
    assert_eq!(n(&counts.rotated), 1);
    hand.advance(1);
    keys.refresh();
    assert_eq!(n(&counts.rotated), 2);
}
