//! Why a proxied exchange failed, who is at fault, what the client is told
//! and whether another server may be tried.

/// A failure on the way to or from an upstream server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Failure {
    /// No server of the pool is in service (health checks, passive marks).
    NoServer,
    /// The TCP connection was refused or could not be made.
    Connect,
    /// Connecting (TCP and TLS) took longer than `connect_timeout`.
    ConnectTimeout,
    /// The TLS handshake with the server failed (certificate, CA, alert).
    Tls,
    /// The server closed or reset the connection before any response byte.
    Reset,
    /// No response head within `response_timeout`.
    ResponseTimeout,
    /// The response head was malformed or its framing ambiguous.
    BadResponse,
    /// The server went silent for `idle_timeout` while a body streamed.
    IdleTimeout,
    /// The exchange took longer than `total_timeout`.
    TotalTimeout,
    /// The server closed the connection in the middle of a body.
    Truncated,
    /// The server was at `max_conns` and its queue was full.
    QueueFull,
    /// The server was at `max_conns` for the whole `queue_timeout`.
    QueueTimeout,
    /// The proxy itself lacked what a connection takes (descriptors,
    /// local ports, socket buffers): no fault of the server's.
    LocalResources,
}

impl Failure {
    /// Stable name for logs and metrics.
    pub fn reason(self) -> &'static str {
        match self {
            Self::NoServer => "no_server",
            Self::Connect => "connect",
            Self::ConnectTimeout => "connect_timeout",
            Self::Tls => "tls",
            Self::Reset => "reset",
            Self::ResponseTimeout => "response_timeout",
            Self::BadResponse => "bad_response",
            Self::IdleTimeout => "idle_timeout",
            Self::TotalTimeout => "total_timeout",
            Self::Truncated => "truncated",
            Self::QueueFull => "queue_full",
            Self::QueueTimeout => "queue_timeout",
            Self::LocalResources => "local_resources",
        }
    }

    /// The status the client gets when this happens before any response
    /// byte: 503 without a server or a connection to it (the queue, the
    /// proxy's own resources), 504 for the timeouts, else 502.
    pub fn status(self) -> u16 {
        match self {
            Self::NoServer | Self::QueueFull | Self::QueueTimeout | Self::LocalResources => 503,
            Self::ConnectTimeout
            | Self::ResponseTimeout
            | Self::IdleTimeout
            | Self::TotalTimeout => 504,
            _ => 502,
        }
    }

    /// Whether nothing of the request reached the server, so any request
    /// may go to another one.
    pub fn before_sending(self) -> bool {
        matches!(
            self,
            Self::Connect | Self::ConnectTimeout | Self::Tls | Self::LocalResources
        )
    }

    /// Whether the failure counts against the server (passive checks):
    /// not a full queue (the server is busy, not failing), nor a lack of
    /// the proxy's own resources, nor a malformed answer: that is the
    /// application's answer to this request (a head over the limit, say),
    /// which any client able to ask for it could otherwise turn into
    /// marks on every server (nginx counts `invalid_header` only when
    /// told to).
    pub fn marks_server(self) -> bool {
        !matches!(
            self,
            Self::NoServer
                | Self::QueueFull
                | Self::QueueTimeout
                | Self::LocalResources
                | Self::BadResponse
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_and_reasons() {
        assert_eq!(Failure::NoServer.status(), 503);
        assert_eq!(Failure::ResponseTimeout.status(), 504);
        assert_eq!(Failure::Tls.status(), 502);
        assert_eq!(Failure::BadResponse.reason(), "bad_response");
        assert!(Failure::Connect.before_sending());
        assert!(!Failure::Reset.before_sending());
        for f in [
            Failure::QueueFull,
            Failure::QueueTimeout,
            Failure::LocalResources,
        ] {
            assert_eq!(f.status(), 503);
            assert!(!f.marks_server(), "{f:?}");
        }
        assert_eq!(Failure::BadResponse.status(), 502);
        assert!(!Failure::BadResponse.marks_server());
        assert!(Failure::Reset.marks_server());
    }
}
