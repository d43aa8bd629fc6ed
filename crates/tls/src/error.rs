//! Errors of certificate loading and of TLS handshakes.

use std::path::PathBuf;

/// A certificate or key that cannot be used. Names the config key and file.
#[derive(Debug, thiserror::Error)]
#[error("key `{key}`: {problem} ({})", path.display())]
pub struct CertError {
    /// Config key, e.g. `listener[0].certificate[1].key`.
    pub key: String,
    /// The file at fault.
    pub path: PathBuf,
    /// What is wrong with it.
    pub problem: String,
}

/// Why a TLS handshake did not complete. Every variant is the client's
/// doing or the network's, never the server's: none is logged above debug.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HandshakeError {
    /// The client closed before the handshake finished.
    #[error("client closed the connection during the handshake")]
    Eof,
    /// A socket error.
    #[error("socket error during the handshake: {0}")]
    Io(#[from] std::io::Error),
    /// The client's SNI matched no certificate and the policy is to reject.
    #[error("unrecognized server name {0:?}")]
    UnrecognizedName(Option<String>),
    /// The ClientHello's legacy_version was SSLv3 or older (RFC 8446 D.5).
    #[error("ClientHello legacy_version {0:#06x} (SSLv3 or older) refused")]
    LegacyVersion(u16),
    /// The TLS layer refused the client (bad record, no common version or cipher...).
    #[error("TLS error: {0}")]
    Tls(#[from] rustls::Error),
}

impl HandshakeError {
    /// A short stable label for metrics.
    pub fn reason(&self) -> &'static str {
        use rustls::Error as E;
        match self {
            Self::Eof => "eof",
            Self::Io(_) => "io",
            Self::UnrecognizedName(_) => "unrecognized_name",
            Self::LegacyVersion(_) => "protocol_version",
            Self::Tls(e) => match e {
                E::InvalidMessage(_) => "invalid_message",
                E::PeerIncompatible(p) => match p {
                    rustls::PeerIncompatible::Tls12NotOffered
                    | rustls::PeerIncompatible::Tls12NotOfferedOrEnabled
                    | rustls::PeerIncompatible::Tls13RequiredForQuic
                    | rustls::PeerIncompatible::SupportedVersionsExtensionRequired => {
                        "protocol_version"
                    }
                    rustls::PeerIncompatible::NoCipherSuitesInCommon => "no_shared_cipher",
                    rustls::PeerIncompatible::NoKxGroupsInCommon => "no_shared_group",
                    rustls::PeerIncompatible::NoSignatureSchemesInCommon => "no_shared_signature",
                    _ => "peer_incompatible",
                },
                E::PeerMisbehaved(_) => "peer_misbehaved",
                E::AlertReceived(_) => "alert_received",
                E::DecryptError => "decrypt_error",
                E::InappropriateMessage { .. } | E::InappropriateHandshakeMessage { .. } => {
                    "unexpected_message"
                }
                // Mutual TLS: the client's certificate was refused, or a
                // required one was not sent.
                E::InvalidCertificate(_) => "client_certificate_invalid",
                E::NoCertificatesPresented => "client_certificate_missing",
                E::Other(_) if crate::KeyUnavailable::cause_of(e).is_some() => "key_unavailable",
                _ => "other",
            },
        }
    }
}
