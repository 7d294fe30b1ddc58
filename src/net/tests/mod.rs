//! Real QUIC on 127.0.0.1: mutual TLS, admission per protocol, join, bad frames,
//! protocol version mismatch. The PKI ([`pki`]) and the client API's wire
//! shape ([`proto`]) have their own files.

mod pki;
mod proto;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::io::AsyncWriteExt;

use super::endpoint::{Endpoint, Peer, Service};
use super::endpoint::{ALPN_AGENT, ALPN_API, ALPN_JOIN, ALPN_RAFT};
use super::error::{close, EndpointError};
use super::frame::{read_frame, write_frame, FrameError};
use super::join::{join, serve_join, JoinAuthority, JoinError, JoinRequest};
use super::pki::{ClusterCa, NodeIdentity};
use super::rpc::{call, serve, RpcError};
use super::token::{hashes_equal, secret_sha256, JoinToken};
use crate::model::Role;

const MAX: usize = 1 << 20;

#[derive(Debug, Serialize, Deserialize)]
struct Echo {
    text: String,
}

#[derive(Debug, PartialEq, Serialize, Deserialize)]
struct EchoReply {
    text: String,
    /// The caller as the server saw it.
    caller: Option<(Role, String)>,
}

fn any_port() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 0))
}

/// Guards against a hung test; not a timing assertion.
async fn bounded<F: Future>(fut: F) -> F::Output {
    tokio::time::timeout(Duration::from_secs(60), fut)
        .await
        .expect("test hung for 60 s")
}

struct Cluster {
    ca: ClusterCa,
    server: Arc<Endpoint>,
    addr: SocketAddr,
}

impl Cluster {
    /// A server "s1" serving every protocol; it does not accept by itself.
    fn start() -> Cluster {
        let ca = ClusterCa::generate("test").expect("CA");
        let identity = ca.issue(Role::Server, "s1").expect("server identity");
        let services = vec![
            Service::raft(),
            Service::agent(),
            Service::api(),
            Service::join(),
        ];
        let server = Endpoint::server(any_port(), &identity, services).expect("server endpoint");
        let addr = server.local_addr().expect("addr");
        Cluster {
            ca,
            server: Arc::new(server),
            addr,
        }
    }

    /// Accepts forever: echo on every protocol but join, which goes to `authority`.
    fn serve(&self, authority: Option<Arc<dyn JoinAuthority>>) {
        let server = self.server.clone();
        let ca_pem = self.ca.cert_pem.clone();
        tokio::spawn(async move {
            while let Some(peer) = server.accept().await {
                if peer.alpn == ALPN_JOIN {
                    if let Some(authority) = authority.clone() {
                        tokio::spawn(serve_join(peer, authority, ca_pem.clone()));
                    }
                } else {
                    tokio::spawn(serve(peer, echo, MAX));
                }
            }
        });
    }

    fn client(&self, role: Role, name: &str) -> Endpoint {
        let identity = self.ca.issue(role, name).expect("client identity");
        Endpoint::client(&identity, any_port()).expect("client endpoint")
    }
}

async fn echo(peer: Arc<Peer>, req: Echo) -> EchoReply {
    EchoReply {
        text: req.text,
        caller: peer.identity.clone(),
    }
}

async fn echo_call(conn: &quinn::Connection, text: &str) -> Result<EchoReply, RpcError> {
    call(
        conn,
        &Echo {
            text: text.to_string(),
        },
        MAX,
    )
    .await
}

#[tokio::test]
async fn mtls_round_trip_between_two_identities_of_one_ca() {
    bounded(async {
        let cluster = Cluster::start();
        cluster.serve(None);
        let client = cluster.client(Role::Agent, "gpu01");

        let peer = client
            .dial(cluster.addr, ALPN_API, &[Role::Server])
            .await
            .expect("dial");
        assert_eq!(peer.identity, Some((Role::Server, "s1".to_string())));
        let reply = echo_call(&peer.conn, "hello").await.expect("call");
        assert_eq!(
            reply,
            EchoReply {
                text: "hello".into(),
                caller: Some((Role::Agent, "gpu01".into()))
            }
        );

        // The connection is cached per (addr, alpn), and re-dialled once closed.
        let again = client
            .dial(cluster.addr, ALPN_API, &[Role::Server])
            .await
            .expect("dial");
        assert_eq!(again.conn.stable_id(), peer.conn.stable_id());
        peer.conn.close(0u32.into(), b"test");
        let fresh = client
            .dial(cluster.addr, ALPN_API, &[Role::Server])
            .await
            .expect("redial");
        assert_ne!(fresh.conn.stable_id(), peer.conn.stable_id());
        assert_eq!(
            echo_call(&fresh.conn, "again").await.expect("call").text,
            "again"
        );

        // A server is not accepted where an agent is expected, fresh or cached.
        let other = cluster.client(Role::Agent, "gpu02");
        let err = other
            .dial(cluster.addr, ALPN_API, &[Role::Agent])
            .await
            .unwrap_err();
        match err {
            EndpointError::Rejected { reason, .. } => {
                assert!(reason.contains("role server"), "{reason}")
            }
            other => panic!("expected the client to reject the server's role, got {other}"),
        }
        let err = client
            .dial(cluster.addr, ALPN_API, &[Role::Agent])
            .await
            .unwrap_err();
        assert!(
            matches!(
                err,
                EndpointError::UnexpectedRole {
                    role: Role::Server,
                    ..
                }
            ),
            "{err}"
        );
    })
    .await
}

#[tokio::test]
async fn a_server_dials_other_servers_from_its_own_endpoint() {
    bounded(async {
        let a = Cluster::start();
        a.serve(None);
        let b_identity = a.ca.issue(Role::Server, "s2").expect("identity");
        let b = Endpoint::server(any_port(), &b_identity, vec![Service::raft()]).expect("b");
        let peer = b
            .dial(a.addr, ALPN_RAFT, &[Role::Server])
            .await
            .expect("dial");
        let reply = echo_call(&peer.conn, "vote").await.expect("call");
        assert_eq!(reply.caller, Some((Role::Server, "s2".into())));
    })
    .await
}

/// A client whose certificate is not from the cluster CA, but which trusts the
/// cluster CA (so it is the server that must refuse it).
fn impostor(cluster: &Cluster, key_pem: String, cert_pem: String) -> Endpoint {
    let identity = NodeIdentity {
        key_pem,
        cert_pem,
        ca_cert_pem: cluster.ca.cert_pem.clone(),
    };
    Endpoint::client(&identity, any_port()).expect("impostor endpoint")
}

fn self_signed_server_cert() -> (String, String) {
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).expect("key");
    let mut params = rcgen::CertificateParams::default();
    params.subject_alt_names = vec![
        rcgen::SanType::URI("gpuq://server/s1".try_into().expect("uri")),
        rcgen::SanType::DnsName("s1".try_into().expect("dns")),
    ];
    params.extended_key_usages = vec![
        rcgen::ExtendedKeyUsagePurpose::ServerAuth,
        rcgen::ExtendedKeyUsagePurpose::ClientAuth,
    ];
    let cert = params.self_signed(&key).expect("self-signed");
    (key.serialize_pem(), cert.pem())
}

#[tokio::test]
async fn certificates_not_from_the_cluster_ca_open_no_protocol() {
    bounded(async {
        let cluster = Cluster::start();
        let other_ca = ClusterCa::generate("other").expect("other CA");
        let foreign = other_ca
            .issue(Role::Server, "s1")
            .expect("foreign identity");
        let (self_key, self_cert) = self_signed_server_cert();
        let impostors = [
            ("self-signed", impostor(&cluster, self_key, self_cert)),
            (
                "other CA",
                impostor(&cluster, foreign.key_pem, foreign.cert_pem),
            ),
        ];
        for (what, client) in &impostors {
            for alpn in [ALPN_API, ALPN_RAFT, ALPN_AGENT, ALPN_JOIN] {
                let result = client.dial(cluster.addr, alpn, &[Role::Server]).await;
                let alpn = String::from_utf8_lossy(alpn);
                match result {
                    Err(EndpointError::Rejected { reason, .. }) => {
                        assert!(
                            reason.to_lowercase().contains("certificate"),
                            "{what} {alpn}: {reason}"
                        )
                    }
                    other => panic!("{what} on {alpn}: expected a TLS rejection, got {other:?}"),
                }
            }
        }

        // And a member refuses a server whose certificate is not from the cluster
        // CA, even one that would accept the member (it trusts the cluster CA).
        let member = cluster.client(Role::Agent, "gpu01");
        let mut fake_server = other_ca.issue(Role::Server, "s9").expect("identity");
        fake_server.ca_cert_pem = cluster.ca.cert_pem.clone();
        let fake =
            Endpoint::server(any_port(), &fake_server, vec![Service::api()]).expect("server");
        let fake_addr = fake.local_addr().expect("addr");
        let err = member
            .dial(fake_addr, ALPN_API, &[Role::Server])
            .await
            .unwrap_err();
        assert!(matches!(err, EndpointError::Rejected { .. }), "{err}");

        // None of the refused connections reached the server's caller: the first
        // peer it accepts is the legitimate one dialled last.
        member
            .dial(cluster.addr, ALPN_API, &[Role::Server])
            .await
            .expect("legit dial");
        let first = cluster.server.accept().await.expect("accepted");
        assert_eq!(first.identity, Some((Role::Agent, "gpu01".into())));
    })
    .await
}

#[tokio::test]
async fn without_a_certificate_only_join_opens() {
    bounded(async {
        let cluster = Cluster::start();
        let fp = cluster.ca.fingerprint().expect("fp");
        let anonymous = Endpoint::anonymous(any_port()).expect("endpoint");

        for alpn in [ALPN_API, ALPN_RAFT, ALPN_AGENT] {
            let err = anonymous.dial_pinned(cluster.addr, alpn, &fp, &[Role::Server]).await.unwrap_err();
            match err {
                EndpointError::Refused { code, reason, .. } => {
                    assert_eq!(code, u64::from(close::CERT_REQUIRED));
                    assert!(reason.contains("certificate"), "{reason}");
                }
                other => panic!("expected the server to close the connection, got {other}"),
            }
        }
        let peer = anonymous.dial_pinned(cluster.addr, ALPN_JOIN, &fp, &[Role::Server]).await.expect("join alpn");
        assert_eq!(peer.identity, Some((Role::Server, "s1".into())));
        let accepted = cluster.server.accept().await.expect("accepted");
        assert_eq!(accepted.alpn, ALPN_JOIN);
        assert_eq!(accepted.identity, None);

        // A member without the right role is refused too.
        let agent = cluster.client(Role::Agent, "gpu01");
        let err = agent.dial(cluster.addr, ALPN_RAFT, &[Role::Server]).await.unwrap_err();
        assert!(
            matches!(err, EndpointError::Refused { code, .. } if code == u64::from(close::ROLE_NOT_ALLOWED)),
            "{err}"
        );
    })
    .await
}

/// Admits holders of one token as agents, naming them itself.
struct TestAuthority {
    ca: ClusterCa,
    token_id: String,
    secret_sha256: String,
}

#[async_trait::async_trait]
impl JoinAuthority for TestAuthority {
    async fn admit(&self, req: &JoinRequest, _from: SocketAddr) -> Result<String, String> {
        if req.token_id != self.token_id
            || !hashes_equal(&secret_sha256(&req.secret), &self.secret_sha256)
        {
            return Err(
                "unknown token or wrong secret; create a new one with `gpuq token create`".into(),
            );
        }
        let name = format!("{}-r1", req.name);
        self.ca
            .sign_csr(&req.csr_pem, Role::Agent, &name, 30)
            .map_err(|e| e.to_string())
    }
}

#[tokio::test]
async fn join_pins_the_ca_proves_the_secret_and_gets_the_servers_identity() {
    bounded(async {
        let cluster = Cluster::start();
        let fp = cluster.ca.fingerprint().expect("fp");
        let token = JoinToken::generate(&fp).expect("token");
        let authority = TestAuthority {
            ca: cluster.ca.clone(),
            token_id: token.id.clone(),
            secret_sha256: token.secret_sha256(),
        };
        cluster.serve(Some(Arc::new(authority)));

        // Asks to be a server; the authority makes it an agent and picks the name.
        let identity = join(cluster.addr, &token, Role::Server, "gpu07")
            .await
            .expect("join");
        assert_eq!(
            identity.verify().expect("verify"),
            (Role::Agent, "gpu07-r1".to_string())
        );

        // The new identity is a working member.
        let member = Endpoint::client(&identity, any_port()).expect("endpoint");
        let peer = member
            .dial(cluster.addr, ALPN_API, &[Role::Server])
            .await
            .expect("dial");
        let reply = echo_call(&peer.conn, "joined").await.expect("call");
        assert_eq!(reply.caller, Some((Role::Agent, "gpu07-r1".into())));

        // A token for another cluster: the client refuses the server before sending the secret.
        let other_fp = ClusterCa::generate("other")
            .expect("CA")
            .fingerprint()
            .expect("fp");
        let mut wrong = token.clone();
        wrong.ca_fingerprint = other_fp.clone();
        let err = join(cluster.addr, &wrong, Role::Agent, "gpu08")
            .await
            .unwrap_err();
        match &err {
            JoinError::WrongCluster {
                expected, found, ..
            } => {
                assert_eq!(expected, &other_fp);
                assert_eq!(found, &fp);
            }
            other => panic!("expected WrongCluster, got {other}"),
        }
        assert!(err.to_string().contains("wrong cluster"), "{err}");

        // Right cluster, wrong secret: the server's reason comes back.
        let mut bad_secret = token.clone();
        bad_secret.secret = "x".repeat(32);
        let err = join(cluster.addr, &bad_secret, Role::Agent, "gpu09")
            .await
            .unwrap_err();
        match err {
            JoinError::Refused { reason } => assert!(reason.contains("wrong secret"), "{reason}"),
            other => panic!("expected Refused, got {other}"),
        }
    })
    .await
}

#[tokio::test]
async fn joining_an_address_where_nothing_listens_says_unreachable() {
    bounded(async {
        // Bind and drop a UDP socket to get a port nobody listens on. QUIC
        // ignores ICMP, so this waits out the 10 s idle timeout.
        let socket = std::net::UdpSocket::bind(any_port()).expect("bind");
        let addr = socket.local_addr().expect("addr");
        drop(socket);
        let fp = ClusterCa::generate("x")
            .expect("CA")
            .fingerprint()
            .expect("fp");
        let token = JoinToken::generate(&fp).expect("token");
        let err = join(addr, &token, Role::Agent, "gpu01").await.unwrap_err();
        assert!(matches!(err, JoinError::Unreachable { .. }), "{err}");
    })
    .await
}

/// Sends raw bytes as a request and reads the answer.
async fn raw_request(
    conn: &quinn::Connection,
    bytes: &[u8],
) -> Result<Option<EchoReply>, FrameError> {
    let (mut send, mut recv) = conn.open_bi().await.expect("open stream");
    // The server may reset the stream before all is written; the read says so.
    let _ = send.write_all(bytes).await;
    let _ = send.finish();
    read_frame(&mut recv, MAX).await
}

#[tokio::test]
async fn a_bad_frame_closes_only_its_own_stream() {
    bounded(async {
        let cluster = Cluster::start();
        cluster.serve(None);
        let a = cluster.client(Role::Agent, "a");
        let b = cluster.client(Role::Agent, "b");
        let conn_a = a
            .dial(cluster.addr, ALPN_API, &[Role::Server])
            .await
            .expect("dial a")
            .conn;
        let conn_b = b
            .dial(cluster.addr, ALPN_API, &[Role::Server])
            .await
            .expect("dial b")
            .conn;

        let mut garbage = 3u32.to_be_bytes().to_vec();
        garbage.extend([0xc1, 0xc1, 0xc1]);
        let oversized = u32::MAX.to_be_bytes().to_vec();
        let mut truncated = 100u32.to_be_bytes().to_vec();
        truncated.extend([0u8; 10]);

        for (what, bytes) in [
            ("garbage", garbage),
            ("oversized", oversized),
            ("truncated", truncated),
        ] {
            let result = raw_request(&conn_a, &bytes).await;
            assert!(
                result.is_err(),
                "{what}: the stream should fail, got {result:?}"
            );
            let same = echo_call(&conn_a, what)
                .await
                .expect("same connection still works");
            assert_eq!(same.text, what);
            let other = echo_call(&conn_b, what)
                .await
                .expect("other client still works");
            assert_eq!(other.text, what);
        }

        // Through `call`, a reset stream reads as a rejected request.
        let err = call::<_, EchoReply>(&conn_a, &"not an Echo", MAX)
            .await
            .unwrap_err();
        assert!(matches!(err, RpcError::Rejected { .. }), "{err}");
    })
    .await
}

#[tokio::test]
async fn a_long_lived_stream_carries_many_frames_each_way() {
    bounded(async {
        let cluster = Cluster::start();
        let client = cluster.client(Role::Agent, "gpu01");
        let server = cluster.server.clone();
        let served = tokio::spawn(async move {
            let peer = server.accept().await.expect("peer");
            let (mut send, mut recv) = peer.conn.accept_bi().await.expect("stream");
            let mut n = 0u32;
            while let Some(msg) = read_frame::<_, Echo>(&mut recv, MAX).await.expect("frame") {
                n += 1;
                write_frame(
                    &mut send,
                    &EchoReply {
                        text: format!("{n}:{}", msg.text),
                        caller: None,
                    },
                )
                .await
                .expect("reply");
            }
            send.finish().expect("finish");
            // Keep the connection until the client has everything.
            let _ = send.stopped().await;
            n
        });

        let peer = client
            .dial(cluster.addr, ALPN_AGENT, &[Role::Server])
            .await
            .expect("dial");
        let (mut send, mut recv) = peer.conn.open_bi().await.expect("open");
        for text in ["a", "b", "c"] {
            write_frame(&mut send, &Echo { text: text.into() })
                .await
                .expect("send");
            let reply: EchoReply = read_frame(&mut recv, MAX)
                .await
                .expect("read")
                .expect("reply");
            assert!(reply.text.ends_with(text), "{}", reply.text);
        }
        send.shutdown().await.expect("finish");
        let end: Option<EchoReply> = read_frame(&mut recv, MAX).await.expect("clean end");
        assert_eq!(end, None);
        assert_eq!(served.await.expect("server task"), 3);
    })
    .await
}

/// Collects log lines written on this thread (tests run on a current-thread runtime).
#[derive(Clone, Default)]
struct Logs(Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Logs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("log buffer").extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Logs {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().expect("log buffer")).into_owned()
    }
}

#[tokio::test]
async fn a_protocol_version_mismatch_names_both_versions() {
    let logs = Logs::default();
    let writer = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    bounded(async {
        let cluster = Cluster::start();
        let identity = cluster.ca.issue(Role::Agent, "future").expect("identity");
        let mut newer = Endpoint::client(&identity, any_port()).expect("endpoint");
        newer.set_protocol_version(2);

        let err = newer
            .dial(cluster.addr, ALPN_API, &[Role::Server])
            .await
            .unwrap_err();
        assert!(
            matches!(
                err,
                EndpointError::ProtocolMismatch {
                    ours: 2,
                    theirs: 1,
                    ..
                }
            ),
            "{err}"
        );
        let text = err.to_string();
        assert!(
            text.contains("protocol 2") && text.contains("protocol 1"),
            "{text}"
        );

        // The refused client goes away (the server logs its warning then).
        drop(newer);

        // The mismatched connection never reached the server's caller.
        let current = cluster.client(Role::Agent, "current");
        current
            .dial(cluster.addr, ALPN_API, &[Role::Server])
            .await
            .expect("dial");
        let first = cluster.server.accept().await.expect("accepted");
        assert_eq!(first.identity, Some((Role::Agent, "current".into())));

        // The server side says so too, naming both versions. (Its warning is
        // written once the refused client has gone; wait for it.)
        let wanted = "this gpuq";
        while !logs.text().contains(wanted) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let line = logs
            .text()
            .lines()
            .find(|l| l.contains(wanted))
            .map(str::to_string);
        let line = line.expect("warning line");
        assert!(
            line.contains("WARN") && line.contains("speaks protocol 1"),
            "{line}"
        );
        assert!(line.contains("speaks protocol 2"), "{line}");
    })
    .await
}
