//! A rustls signing key whose private half lives in another process.
//!
//! [`RemoteKey`] knows only public facts about the key (its algorithm, the
//! schemes it signs with, its public key); every signature is forwarded to
//! a [`KeyBackend`] (in tlsgate, the client of the key process). A backend
//! that cannot sign makes the handshake fail with [`KeyUnavailable`], which
//! is counted under the handshake failure reason `key_unavailable`.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tlsgate_sys::suspend::{self, Answer, Step, Suspendable};

use rustls::pki_types::SubjectPublicKeyInfoDer;
use rustls::sign::{Signer, SigningKey};
use rustls::{SignatureAlgorithm, SignatureScheme};

/// Every scheme rustls can sign a handshake with.
pub const SIGNING_SCHEMES: [SignatureScheme; 10] = [
    SignatureScheme::ECDSA_NISTP256_SHA256,
    SignatureScheme::ECDSA_NISTP384_SHA384,
    SignatureScheme::ECDSA_NISTP521_SHA512,
    SignatureScheme::ED25519,
    SignatureScheme::RSA_PSS_SHA512,
    SignatureScheme::RSA_PSS_SHA384,
    SignatureScheme::RSA_PSS_SHA256,
    SignatureScheme::RSA_PKCS1_SHA512,
    SignatureScheme::RSA_PKCS1_SHA384,
    SignatureScheme::RSA_PKCS1_SHA256,
];

/// The public description of a key: what the network side needs to choose
/// it and to ask for signatures.
#[derive(Clone, PartialEq, Eq)]
pub struct KeyInfo {
    /// Stable id: derived from the public key, so the same key has the same
    /// id across reloads and restarts of the key process.
    pub id: u64,
    /// ECDSA, RSA, Ed25519.
    pub algorithm: SignatureAlgorithm,
    /// Schemes the key signs with, in its order of preference.
    pub schemes: Vec<SignatureScheme>,
    /// SubjectPublicKeyInfo DER.
    pub spki: Vec<u8>,
}

impl fmt::Debug for KeyInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyInfo")
            .field("id", &format_args!("{:016x}", self.id))
            .field("algorithm", &self.algorithm)
            .field("schemes", &self.schemes)
            .finish_non_exhaustive()
    }
}

impl KeyInfo {
    /// Describes a key held in this process. `None` when it cannot say its
    /// public key (every aws-lc-rs key can).
    pub fn of(key: &dyn SigningKey) -> Option<KeyInfo> {
        let spki = key.public_key()?.as_ref().to_vec();
        // The key's preference order: ask it again without its last choice.
        let mut offered = SIGNING_SCHEMES.to_vec();
        let mut schemes = Vec::new();
        while let Some(signer) = key.choose_scheme(&offered) {
            let s = signer.scheme();
            schemes.push(s);
            offered.retain(|o| *o != s);
        }
        Some(KeyInfo {
            id: fingerprint(&spki),
            algorithm: key.algorithm(),
            schemes,
            spki,
        })
    }
}

/// The first 8 bytes of SHA-256 over `spki`.
pub fn fingerprint(spki: &[u8]) -> u64 {
    use rustls::crypto::aws_lc_rs::cipher_suite::TLS13_AES_128_GCM_SHA256;
    // The provider's SHA-256 (the suite's transcript hash), not another crate.
    let digest = TLS13_AES_128_GCM_SHA256
        .tls13()
        .map(|s| s.common.hash_provider.hash(spki));
    let mut id = [0u8; 8];
    if let Some(d) = digest {
        for (dst, src) in id.iter_mut().zip(d.as_ref()) {
            *dst = *src;
        }
    }
    u64::from_be_bytes(id)
}

/// Why a remote signature could not be had.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("private key unavailable: {}", self.describe())]
pub enum KeyUnavailable {
    /// No key process is connected (it died and is being restarted).
    Down,
    /// The key process did not answer in time.
    Timeout,
    /// The key process answered with an error (unknown key, bad request).
    Refused,
    /// Too many signatures are already waiting.
    Busy,
}

impl KeyUnavailable {
    /// The failure inside a rustls error, when a signature asked of a
    /// [`KeyBackend`] is why the handshake failed.
    pub fn cause_of(e: &rustls::Error) -> Option<KeyUnavailable> {
        match e {
            rustls::Error::Other(o) => o.0.downcast_ref::<KeyUnavailable>().copied(),
            _ => None,
        }
    }

    /// A short stable label for metrics.
    pub fn reason(self) -> &'static str {
        match self {
            Self::Down => "down",
            Self::Timeout => "timeout",
            Self::Refused => "refused",
            Self::Busy => "busy",
        }
    }

    fn describe(self) -> &'static str {
        match self {
            Self::Down => "the key process is not running",
            Self::Timeout => "the key process did not answer in time",
            Self::Refused => "the key process refused to sign",
            Self::Busy => "too many signatures waiting",
        }
    }
}

/// A signature, or why there is none.
pub type SignResult = Result<Vec<u8>, KeyUnavailable>;

/// A signature on its way (see [`KeyBackend::sign_later`]).
pub type SignFuture = Pin<Box<dyn Future<Output = SignResult> + Send>>;

/// Whatever forwards signatures to the key holder.
pub trait KeyBackend: Send + Sync + fmt::Debug {
    /// Signs `message` with key `key_id` using `scheme`; blocks the calling
    /// thread until the answer or the backend's timeout.
    fn sign(&self, key_id: u64, scheme: SignatureScheme, message: &[u8]) -> SignResult;

    /// The same without blocking the thread: what a handshake run by
    /// [`run_signing`] awaits while its worker serves other connections.
    /// By default it signs at once, blocking.
    fn sign_later(
        self: Arc<Self>,
        key_id: u64,
        scheme: SignatureScheme,
        message: Vec<u8>,
    ) -> SignFuture {
        Box::pin(std::future::ready(self.sign(key_id, scheme, &message)))
    }
}

/// What a [`RemoteSigner`] asks for from inside a suspended handshake.
struct SignRequest {
    backend: Arc<dyn KeyBackend>,
    key_id: u64,
    scheme: SignatureScheme,
    message: Vec<u8>,
}

/// The call moved to another thread before it finished (tokio's
/// current-thread workers never move a task, so this does not happen).
#[derive(Debug, Clone, Copy, thiserror::Error)]
#[error("a suspended handshake was resumed on another thread")]
pub struct MovedThread;

thread_local! {
    /// Set while [`run_signing`] runs a call directly, without a stack of
    /// its own: a signature asked for there is refused, not waited for.
    static REFUSE_BLOCKING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Clears [`REFUSE_BLOCKING`] when the direct call ends (or unwinds).
struct RefusingBlocking;

impl Drop for RefusingBlocking {
    fn drop(&mut self) {
        REFUSE_BLOCKING.with(|r| r.set(false));
    }
}

/// Runs `call` (rustls' processing of a ClientHello) so that each remote
/// signature inside it is awaited through [`KeyBackend::sign_later`]
/// instead of blocking the thread. Without a stack for it (this thread
/// already holds `MAX_SUSPENDED` calls waiting for the key process, or
/// none can be mapped), `call` runs directly and a signature in it fails
/// at once as [`KeyUnavailable::Busy`]: waiting for it there would block
/// the worker, and every connection it serves, for up to `key_timeout`
/// per signature, one after another, just when the key process is
/// slowest (a resumption needs no signature and still succeeds).
pub async fn run_signing<R, F>(call: F) -> Result<R, MovedThread>
where
    R: Send + 'static,
    F: FnOnce() -> R + 'static,
{
    let mut call = match Suspendable::start(call) {
        Ok(c) => c,
        Err(call) => {
            REFUSE_BLOCKING.with(|r| r.set(true));
            let _refusing = RefusingBlocking;
            return Ok(call());
        }
    };
    let mut answer: Option<Answer> = None;
    loop {
        match call.resume(answer.take()).ok_or(MovedThread)? {
            Step::Done(r) => return Ok(r),
            Step::Asked(question) => {
                let signed: SignResult = match question.downcast::<SignRequest>() {
                    Ok(req) => {
                        let SignRequest {
                            backend,
                            key_id,
                            scheme,
                            message,
                        } = *req;
                        backend.sign_later(key_id, scheme, message).await
                    }
                    Err(_) => Err(KeyUnavailable::Refused),
                };
                answer = Some(Box::new(signed));
            }
        }
    }
}

/// Awaits `fut` with each of its polls run the way [`run_signing`] runs
/// its call, so that a remote signature asked for inside a poll is awaited
/// instead of blocking the thread: an upstream's request for a client
/// certificate makes rustls sign inside tokio-rustls' handshake poll. A
/// poll that ends `Pending` has registered this task's waker (the inner
/// poll is given it), so this returns `Pending` once to the executor.
///
/// Each poll switches to a stack of its own and back (the future is boxed
/// once, so only a pointer moves): meant for the few polls of a handshake
/// that may sign. Without a stack (too many suspended on this thread) a
/// poll runs directly and a signature in it fails as `Busy`.
pub async fn poll_signing<F>(fut: F) -> Result<F::Output, MovedThread>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    let mut fut = Box::pin(fut);
    loop {
        let waker = std::future::poll_fn(|cx| Poll::Ready(cx.waker().clone())).await;
        let (back, polled) = run_signing(move || {
            let polled = fut.as_mut().poll(&mut Context::from_waker(&waker));
            (fut, polled)
        })
        .await?;
        match polled {
            Poll::Ready(out) => return Ok(out),
            Poll::Pending => {
                fut = back;
                let mut yielded = false;
                std::future::poll_fn(|_| {
                    if std::mem::replace(&mut yielded, true) {
                        Poll::Ready(())
                    } else {
                        Poll::Pending
                    }
                })
                .await;
            }
        }
    }
}

/// A signing key held by a [`KeyBackend`].
#[derive(Debug)]
pub struct RemoteKey {
    info: KeyInfo,
    backend: Arc<dyn KeyBackend>,
}

impl RemoteKey {
    /// A key described by `info`, signing through `backend`.
    pub fn new(info: KeyInfo, backend: Arc<dyn KeyBackend>) -> Self {
        Self { info, backend }
    }

    /// Its description.
    pub fn info(&self) -> &KeyInfo {
        &self.info
    }
}

impl SigningKey for RemoteKey {
    fn choose_scheme(&self, offered: &[SignatureScheme]) -> Option<Box<dyn Signer>> {
        let scheme = *self.info.schemes.iter().find(|s| offered.contains(s))?;
        Some(Box::new(RemoteSigner {
            key_id: self.info.id,
            scheme,
            backend: self.backend.clone(),
        }))
    }

    fn public_key(&self) -> Option<SubjectPublicKeyInfoDer<'_>> {
        Some(SubjectPublicKeyInfoDer::from(self.info.spki.as_slice()))
    }

    fn algorithm(&self) -> SignatureAlgorithm {
        self.info.algorithm
    }
}

#[derive(Debug)]
struct RemoteSigner {
    key_id: u64,
    scheme: SignatureScheme,
    backend: Arc<dyn KeyBackend>,
}

impl Signer for RemoteSigner {
    fn sign(&self, message: &[u8]) -> Result<Vec<u8>, rustls::Error> {
        let request = SignRequest {
            backend: self.backend.clone(),
            key_id: self.key_id,
            scheme: self.scheme,
            message: message.to_vec(),
        };
        // Inside `run_signing` the handshake waits for the answer there;
        // run directly by it for want of a stack, it is refused; anywhere
        // else (outside the server's handshakes) this thread waits.
        let signed = match suspend::ask(Box::new(request)) {
            Ok(answer) => answer
                .downcast::<SignResult>()
                .map_or(Err(KeyUnavailable::Refused), |r| *r),
            Err(_) if REFUSE_BLOCKING.with(std::cell::Cell::get) => Err(KeyUnavailable::Busy),
            Err(_) => self.backend.sign(self.key_id, self.scheme, message),
        };
        signed.map_err(|e| rustls::Error::Other(rustls::OtherError(Arc::new(e))))
    }

    fn scheme(&self) -> SignatureScheme {
        self.scheme
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use rustls::crypto::aws_lc_rs::sign::any_supported_type;
    use rustls::pki_types::PrivateKeyDer;
    use x509_parser::prelude::{FromDer, SubjectPublicKeyInfo};

    fn local(alg: &'static rcgen::SignatureAlgorithm) -> Arc<dyn SigningKey> {
        let k = rcgen::KeyPair::generate_for(alg).unwrap();
        any_supported_type(&PrivateKeyDer::Pkcs8(k.serialize_der().into())).unwrap()
    }

    /// Signs in-process, as the key process would.
    #[derive(Debug)]
    struct Local(Arc<dyn SigningKey>, Option<KeyUnavailable>);

    impl KeyBackend for Local {
        fn sign(&self, _: u64, s: SignatureScheme, m: &[u8]) -> Result<Vec<u8>, KeyUnavailable> {
            if let Some(e) = self.1 {
                return Err(e);
            }
            Ok(self.0.choose_scheme(&[s]).unwrap().sign(m).unwrap())
        }
    }

    /// Signs only the awaited way, when the test lets it: the blocking
    /// way says `Busy`.
    #[derive(Debug)]
    struct Later(std::sync::Mutex<Option<tokio::sync::oneshot::Receiver<Vec<u8>>>>);

    impl KeyBackend for Later {
        fn sign(&self, _: u64, _: SignatureScheme, _: &[u8]) -> SignResult {
            Err(KeyUnavailable::Busy)
        }
        fn sign_later(self: Arc<Self>, _: u64, _: SignatureScheme, _: Vec<u8>) -> SignFuture {
            let rx = self.0.lock().unwrap().take().unwrap();
            Box::pin(async move { rx.await.map_err(|_| KeyUnavailable::Down) })
        }
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_signature_inside_a_poll_is_awaited_while_the_thread_runs_other_tasks() {
        let key = local(&rcgen::PKCS_ECDSA_P256_SHA256);
        let (tx, rx) = tokio::sync::oneshot::channel();
        let remote = RemoteKey::new(
            KeyInfo::of(&*key).unwrap(),
            Arc::new(Later(std::sync::Mutex::new(Some(rx)))),
        );
        let signer = remote
            .choose_scheme(&[SignatureScheme::ECDSA_NISTP256_SHA256])
            .unwrap();
        // Pending once (woken at once), then a poll that signs, as a
        // handshake's poll does when the upstream asks for a certificate.
        let mut polls = 0;
        let handshake = std::future::poll_fn(move |cx| {
            polls += 1;
            if polls == 1 {
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
            Poll::Ready((polls, signer.sign(b"transcript")))
        });
        // Another task of this thread answers, which it can only do while
        // the signing poll is suspended.
        tokio::spawn(async move { tx.send(vec![42]).unwrap() });
        let (polls, signed) = poll_signing(handshake).await.unwrap();
        assert_eq!(polls, 2);
        assert_eq!(signed.unwrap(), vec![42]);
        // Outside it, the same signer blocks (here: the backend's `Busy`).
        let signer = remote
            .choose_scheme(&[SignatureScheme::ECDSA_NISTP256_SHA256])
            .unwrap();
        assert!(signer.sign(b"transcript").is_err());
    }

    /// Never answers the awaited way; counts blocking signatures and
    /// awaited ones asked for.
    #[derive(Debug, Default)]
    struct Stuck(
        std::sync::atomic::AtomicUsize,
        std::sync::atomic::AtomicUsize,
    );

    impl KeyBackend for Stuck {
        fn sign(&self, _: u64, _: SignatureScheme, _: &[u8]) -> SignResult {
            self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Ok(vec![1])
        }
        fn sign_later(self: Arc<Self>, _: u64, _: SignatureScheme, _: Vec<u8>) -> SignFuture {
            self.1.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Box::pin(std::future::pending())
        }
    }

    #[tokio::test(flavor = "current_thread")]
    async fn past_the_threads_suspended_handshakes_a_signature_is_refused_not_waited_for() {
        let key = local(&rcgen::PKCS_ECDSA_P256_SHA256);
        let stuck = Arc::new(Stuck::default());
        let remote = Arc::new(RemoteKey::new(KeyInfo::of(&*key).unwrap(), stuck.clone()));
        let sign = |remote: Arc<RemoteKey>| {
            move || {
                remote
                    .choose_scheme(&[SignatureScheme::ECDSA_NISTP256_SHA256])
                    .unwrap()
                    .sign(b"transcript")
            }
        };
        let local_set = tokio::task::LocalSet::new();
        local_set
            .run_until(async {
                // A key process that answers nothing: every handshake
                // waits, suspended, up to the thread's limit (1024).
                let waiting: Vec<_> = (0..1024)
                    .map(|_| tokio::task::spawn_local(run_signing(sign(remote.clone()))))
                    .collect();
                while stuck.1.load(std::sync::atomic::Ordering::SeqCst) < 1024 {
                    tokio::task::yield_now().await;
                }
                // One more has no stack: it fails at once instead of
                // blocking the thread in the backend's blocking call.
                let over = run_signing(sign(remote.clone())).await.unwrap();
                let Err(e) = over else { panic!("{over:?}") };
                assert_eq!(KeyUnavailable::cause_of(&e), Some(KeyUnavailable::Busy));
                assert_eq!(stuck.0.load(std::sync::atomic::Ordering::SeqCst), 0);
                assert!(waiting.iter().all(|t| !t.is_finished()));
                for t in waiting {
                    t.abort();
                }
            })
            .await;
        // Outside a server's handshake the blocking way is still taken.
        assert!(sign(remote)().is_ok());
        assert_eq!(stuck.0.load(std::sync::atomic::Ordering::SeqCst), 1);
    }

    #[test]
    fn describes_keys_in_their_preference_order() {
        let e = KeyInfo::of(&*local(&rcgen::PKCS_ECDSA_P256_SHA256)).unwrap();
        assert_eq!(e.schemes, vec![SignatureScheme::ECDSA_NISTP256_SHA256]);
        assert_eq!(e.algorithm, SignatureAlgorithm::ECDSA);
        let r = KeyInfo::of(&*local(&rcgen::PKCS_RSA_SHA256)).unwrap();
        assert_eq!(r.schemes.len(), 6, "{r:?}");
        assert_eq!(r.schemes[0], SignatureScheme::RSA_PSS_SHA512);
        assert_ne!(e.id, r.id);
        assert_eq!(e.id, fingerprint(&e.spki));
        assert!(!format!("{e:?}").contains("spki"));
    }

    #[test]
    fn remote_signatures_verify_and_failures_are_typed() {
        let key = local(&rcgen::PKCS_ECDSA_P256_SHA256);
        let info = KeyInfo::of(&*key).unwrap();
        let remote = RemoteKey::new(info.clone(), Arc::new(Local(key.clone(), None)));
        assert!(remote
            .choose_scheme(&[SignatureScheme::RSA_PSS_SHA256])
            .is_none());
        let signer = remote
            .choose_scheme(&[
                SignatureScheme::RSA_PSS_SHA256,
                SignatureScheme::ECDSA_NISTP256_SHA256,
            ])
            .unwrap();
        let sig = signer.sign(b"message").unwrap();
        let spki = remote.public_key().unwrap();
        let (_, parsed) = SubjectPublicKeyInfo::from_der(spki.as_ref()).unwrap();
        let algs = rustls::crypto::aws_lc_rs::default_provider().signature_verification_algorithms;
        let (_, verifiers) = algs
            .mapping
            .iter()
            .find(|(s, _)| *s == SignatureScheme::ECDSA_NISTP256_SHA256)
            .unwrap();
        let ok = verifiers.iter().any(|v| {
            v.verify_signature(&parsed.subject_public_key.data, b"message", &sig)
                .is_ok()
        });
        assert!(ok, "the signature verifies against the public key");

        let down = RemoteKey::new(info, Arc::new(Local(key, Some(KeyUnavailable::Down))));
        let e = down
            .choose_scheme(&[SignatureScheme::ECDSA_NISTP256_SHA256])
            .unwrap()
            .sign(b"m")
            .unwrap_err();
        assert!(e.to_string().contains("not running"), "{e}");
    }
}
