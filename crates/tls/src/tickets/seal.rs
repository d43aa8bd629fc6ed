//! One ticket key and the ticket format.
//!
//! ```text
//! key name (16) | nonce (12) | AES-256-GCM( issued_at u64 BE | state ) | tag (16)
//! ```
//!
//! Name and AEAD key are derived from the secret with HKDF-SHA256 under
//! different labels, so the name (sent in every ticket) says nothing about
//! the key. The name and the listener context are the additional data: a
//! ticket opens only under its key and on its listener. The issue time is
//! sealed, so expiry does not depend on what the client says.

use aws_lc_rs::aead::{Aad, Nonce, RandomizedNonceKey, AES_256_GCM, NONCE_LEN};
use aws_lc_rs::hkdf::{Salt, HKDF_SHA256};
use zeroize::{Zeroize, Zeroizing};

use super::file::{Secret, KEY_LEN};

/// Bytes of a key name.
pub(crate) const NAME_LEN: usize = 16;
const TAG_LEN: usize = 16;
const TIME_LEN: usize = 8;
/// Name, nonce, issue time and tag: the smallest possible ticket.
pub(crate) const OVERHEAD: usize = NAME_LEN + NONCE_LEN + TIME_LEN + TAG_LEN;
/// Largest ticket opened; rustls' own session state is far smaller, even
/// with a client certificate chain.
pub(crate) const MAX_TICKET_LEN: usize = 64 * 1024;

/// Salt of the derivation; changing it changes every key name and key.
const SALT: &[u8] = b"tlsgate session ticket key v1";

/// A ticket key ready for use. The raw secret is not kept; aws-lc wipes
/// its key schedule when the key is freed (`OPENSSL_free` cleanses).
pub(crate) struct TicketKey {
    name: [u8; NAME_LEN],
    aead: RandomizedNonceKey,
    /// Unix seconds when this key began encrypting (in-memory keys).
    pub(crate) since: u64,
}

impl std::fmt::Debug for TicketKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "TicketKey({})", self.id())
    }
}

/// Why a ticket did not open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// No key with the ticket's key name (dropped, or never ours).
    UnknownKey,
    /// Older than the lifetime.
    Expired,
    /// Malformed, tampered with, from another listener, or issued in the future.
    Invalid,
}

/// Tickets issued this far in the future (clock skew in a fleet) still open.
const MAX_FUTURE_SKEW_SECS: u64 = 60;

impl TicketKey {
    pub(crate) fn derive(secret: &Secret, since: u64) -> Result<Self, ()> {
        let prk = Salt::new(HKDF_SHA256, SALT).extract(secret.expose());
        let mut name = [0u8; NAME_LEN];
        prk.expand(&[b"key name"], Len(NAME_LEN))
            .and_then(|okm| okm.fill(&mut name))
            .map_err(|_| ())?;
        let mut key = Zeroizing::new([0u8; KEY_LEN]);
        prk.expand(&[b"aes-256-gcm key"], Len(KEY_LEN))
            .and_then(|okm| okm.fill(&mut key[..]))
            .map_err(|_| ())?;
        let aead = RandomizedNonceKey::new(&AES_256_GCM, &key[..]).map_err(|_| ())?;
        Ok(Self { name, aead, since })
    }

    /// The first 4 bytes of the name in hex: safe to log (it is in every
    /// ticket), enough to see which key a fleet member encrypts with.
    pub(crate) fn id(&self) -> String {
        self.name[..4].iter().map(|b| format!("{b:02x}")).collect()
    }

    fn aad(&self, context: &[u8]) -> Vec<u8> {
        let mut aad = Vec::with_capacity(NAME_LEN + context.len());
        aad.extend_from_slice(&self.name);
        aad.extend_from_slice(context);
        aad
    }

    /// Seals `state` issued at `now` for the listener `context`.
    pub(crate) fn seal(&self, context: &[u8], state: &[u8], now: u64) -> Option<Vec<u8>> {
        let mut body = Vec::with_capacity(TIME_LEN + state.len() + TAG_LEN);
        body.extend_from_slice(&now.to_be_bytes());
        body.extend_from_slice(state);
        let nonce = match self
            .aead
            .seal_in_place_append_tag(Aad::from(self.aad(context)), &mut body)
        {
            Ok(n) => n,
            Err(_) => {
                body.zeroize();
                return None;
            }
        };
        let mut ticket = Vec::with_capacity(NAME_LEN + NONCE_LEN + body.len());
        ticket.extend_from_slice(&self.name);
        ticket.extend_from_slice(nonce.as_ref());
        ticket.extend_from_slice(&body);
        Some(ticket)
    }
}

/// The key name a ticket claims, if it is long enough to be one of ours.
pub(crate) fn claimed_name(ticket: &[u8]) -> Option<&[u8]> {
    if ticket.len() < OVERHEAD || ticket.len() > MAX_TICKET_LEN {
        return None;
    }
    ticket.get(..NAME_LEN)
}

/// Opens `ticket` with the first of `keys` whose name it carries, and
/// checks its age against `lifetime` at `now`.
pub(crate) fn open<'k>(
    keys: impl IntoIterator<Item = &'k TicketKey>,
    context: &[u8],
    ticket: &[u8],
    now: u64,
    lifetime: u64,
) -> Result<Vec<u8>, Refused> {
    let name = claimed_name(ticket).ok_or(Refused::Invalid)?;
    let (nonce, sealed) = ticket[NAME_LEN..].split_at(NONCE_LEN);
    let mut matched = false;
    for key in keys.into_iter().filter(|k| k.name[..] == *name) {
        matched = true;
        let Ok(nonce) = Nonce::try_assume_unique_for_key(nonce) else {
            return Err(Refused::Invalid);
        };
        let mut buf = sealed.to_vec();
        let plain_len = match key
            .aead
            .open_in_place(nonce, Aad::from(key.aad(context)), &mut buf)
        {
            Ok(p) => p.len(),
            Err(_) => {
                buf.zeroize();
                continue;
            }
        };
        buf.truncate(plain_len);
        let mut issued = [0u8; TIME_LEN];
        issued.copy_from_slice(&buf[..TIME_LEN]);
        let issued = u64::from_be_bytes(issued);
        let verdict = if issued > now.saturating_add(MAX_FUTURE_SKEW_SECS) {
            Err(Refused::Invalid)
        } else if now.saturating_sub(issued) > lifetime {
            Err(Refused::Expired)
        } else {
            Ok(())
        };
        if let Err(r) = verdict {
            buf.zeroize();
            return Err(r);
        }
        let state = buf[TIME_LEN..].to_vec();
        buf.zeroize();
        return Ok(state);
    }
    Err(if matched {
        Refused::Invalid
    } else {
        Refused::UnknownKey
    })
}

/// An HKDF output length.
struct Len(usize);

impl aws_lc_rs::hkdf::KeyType for Len {
    fn len(&self) -> usize {
        self.0
    }
}
