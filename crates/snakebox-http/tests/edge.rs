//! The edge of the HTTP face, request by request through the real router (a real engine on
//! the `none` backend behind it: what is under test is what a request meets before and around
//! the MCP handler): foreign `Host` and `Origin` refused on every route, JSON required on
//! POSTs, keys required once one exists (401 with `WWW-Authenticate`), and one tenant's
//! artifacts "not found" for another.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use serde_json::json;
use snakebox_http::{HttpConfig, HttpError};
use snakebox_test::http::{self, rpc, with_key};
use snakebox_test::{HttpClient, TestEngine};
use tokio_util::sync::CancellationToken;

const ROUTES: [&str; 5] = ["/mcp", "/sse", "/healthz", "/readyz", "/nope"];

/// Published as `snakebox.example.com`, called from `app.example.com`'s pages.
fn config(addr: &str) -> HttpConfig {
    HttpConfig {
        addr: addr.parse().unwrap(),
        public_url: Some("https://snakebox.example.com".into()),
        allowed_origins: vec!["https://app.example.com".into()],
        ..http::config()
    }
}

/// A loopback bind published as `snakebox.example.com` by a proxy that authenticates (so
/// `--insecure-no-auth`: without a key, the local tenant).
fn router(test: &TestEngine) -> HttpClient {
    test.http_with(|http| {
        *http = config("127.0.0.1:0");
        http.insecure_no_auth = true;
    })
}

#[tokio::test]
async fn every_route_refuses_a_foreign_host_with_a_hint() {
    let test = TestEngine::new().await;
    let router = router(&test);
    for path in ROUTES {
        for host in [
            "evil.example",
            "evil.example:8000",
            "127.0.0.1.evil.example",
        ] {
            let request = Request::get(path)
                .header(header::HOST, host)
                .body(Body::empty())
                .unwrap();
            let reply = router.send(request).await;
            let (status, body) = (reply.status, reply.json());
            assert_eq!(status, StatusCode::FORBIDDEN, "{path} {host}");
            assert!(
                body["hint"].as_str().unwrap().contains("--allowed-host"),
                "{body}"
            );
        }
        // Proof that the route is there for an allowed host. Only the status is read: `GET
        // /sse` answers with an event stream that stays open.
        let request = Request::get(path)
            .header(header::HOST, "localhost:8000")
            .body(Body::empty())
            .unwrap();
        let status = router.response(request).await.status();
        assert_ne!(status, StatusCode::FORBIDDEN, "{path}");
    }
    // The public URL's host is allowed too.
    let request = Request::get("/healthz")
        .header(header::HOST, "snakebox.example.com")
        .body(Body::empty())
        .unwrap();
    assert_eq!(router.send(request).await.status, StatusCode::OK);
}

#[tokio::test]
async fn a_foreign_origin_is_refused_on_every_route_and_allowed_ones_pass() {
    let test = TestEngine::new().await;
    let router = router(&test);
    for path in ROUTES {
        let request = Request::get(path)
            .header(header::HOST, "127.0.0.1:8000")
            .header(header::ORIGIN, "https://evil.example")
            .body(Body::empty())
            .unwrap();
        assert_eq!(
            router.send(request).await.status,
            StatusCode::FORBIDDEN,
            "{path}"
        );
    }
    for origin in [
        "http://127.0.0.1:8000",
        "https://app.example.com",
        "https://snakebox.example.com",
    ] {
        let mut request = rpc("tools/list", json!({}));
        request
            .headers_mut()
            .insert(header::ORIGIN, origin.parse().unwrap());
        let reply = router.send(request).await;
        let (status, body) = (reply.status, reply.json());
        assert_eq!(status, StatusCode::OK, "{origin}: {body}");
    }
}

#[tokio::test]
async fn posts_must_be_json() {
    let test = TestEngine::new().await;
    let router = router(&test);
    for content_type in [
        None,
        Some("text/plain"),
        Some("application/x-www-form-urlencoded"),
    ] {
        for path in ["/mcp", "/sse"] {
            let mut request = Request::post(path).header(header::HOST, "127.0.0.1");
            if let Some(content_type) = content_type {
                request = request.header(header::CONTENT_TYPE, content_type);
            }
            let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}).to_string();
            let reply = router.send(request.body(Body::from(body)).unwrap()).await;
            let (status, body) = (reply.status, reply.json());
            assert_eq!(
                status,
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "{path} {content_type:?}"
            );
            assert!(body["hint"].as_str().unwrap().contains("application/json"));
        }
    }
}

#[tokio::test]
async fn once_a_key_exists_every_mcp_request_needs_a_live_one() {
    let test = TestEngine::new().await;
    let router = router(&test);
    let keys = test.keys();
    // No key yet, loopback: the local tenant, without authentication.
    let reply = router.send(rpc("tools/list", json!({}))).await;
    let (status, body) = (reply.status, reply.json());
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(body["result"]["tools"].as_array().unwrap().len() > 5);

    let made = keys.add("team-a").unwrap();
    // From now on a key is needed: none, a wrong one, another scheme.
    for request in [
        rpc("tools/list", json!({})),
        with_key(rpc("tools/list", json!({})), "sbx_0000"),
        with_key(
            rpc("tools/list", json!({})),
            &made.key[..made.key.len() - 1],
        ),
    ] {
        let reply = router.send(request).await;
        let (status, headers, body) = (reply.status, reply.headers.clone(), reply.json());
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
        assert_eq!(
            headers.get(header::WWW_AUTHENTICATE).unwrap(),
            "Bearer realm=\"snakebox\""
        );
        assert!(body["hint"].as_str().unwrap().contains("snakebox keys add"));
    }
    // `?api_key=` is for GET /sse only.
    let mut request = rpc("tools/list", json!({}));
    *request.uri_mut() = format!("/mcp?api_key={}", made.key).parse().unwrap();
    assert_eq!(router.send(request).await.status, StatusCode::UNAUTHORIZED);
    // The probes stay open.
    let probe = Request::get("/healthz")
        .header(header::HOST, "127.0.0.1")
        .body(Body::empty())
        .unwrap();
    assert_eq!(router.send(probe).await.status, StatusCode::OK);
    // The right key works; revoked, it stops at the next request.
    let status = router
        .send(with_key(rpc("tools/list", json!({})), &made.key))
        .await
        .status;
    assert_eq!(status, StatusCode::OK);
    keys.revoke(&made.info.id).unwrap();
    let status = router
        .send(with_key(rpc("tools/list", json!({})), &made.key))
        .await
        .status;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn each_group_of_routes_is_authorised_its_own_way() {
    let test = TestEngine::new().await;
    let router = router(&test);
    test.keys().add("team-a").unwrap();
    let plain = |method: &str, path: &str, json: bool| {
        let mut request = Request::builder()
            .method(method)
            .uri(path)
            .header(header::HOST, "127.0.0.1");
        if json {
            request = request.header(header::CONTENT_TYPE, "application/json");
        }
        request
            .body(Body::from(if method == "POST" { "{}" } else { "" }))
            .unwrap()
    };
    // The routes that take API keys: none presented, 401 with the challenge.
    for (method, path) in [
        ("POST", "/mcp"),
        ("GET", "/mcp"),
        ("GET", "/sse"),
        ("POST", "/sse"),
        ("GET", "/metrics"),
    ] {
        let reply = router.send(plain(method, path, true)).await;
        assert_eq!(reply.status, StatusCode::UNAUTHORIZED, "{method} {path}");
        assert!(
            reply.headers.contains_key(header::WWW_AUTHENTICATE),
            "{method} {path}"
        );
    }
    // A legacy SSE post without a key reaches its handler, which wants its session.
    let reply = router.send(plain("POST", "/messages", true)).await;
    assert_ne!(reply.status, StatusCode::UNAUTHORIZED);
    assert!(reply.status.is_client_error(), "{}", reply.status);
    // ...and must be JSON like every post of a route that takes keys.
    let reply = router.send(plain("POST", "/messages", false)).await;
    assert_eq!(reply.status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
    // With a wrong key, it is refused as the keyed routes are.
    let reply = router
        .send(with_key(plain("POST", "/messages", true), "sbx_0000"))
        .await;
    assert_eq!(reply.status, StatusCode::UNAUTHORIZED);
    // Probes answer anyone; an unknown path is not found for anyone.
    assert_eq!(
        router.send(plain("GET", "/healthz", false)).await.status,
        StatusCode::OK
    );
    assert_ne!(
        router.send(plain("GET", "/readyz", false)).await.status,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        router.send(plain("GET", "/nope", false)).await.status,
        StatusCode::NOT_FOUND
    );
    // The web UI sends a browser to its login page; a download link wants its signature.
    let reply = router.send(plain("GET", "/ui/", false)).await;
    assert!(
        reply.status.is_redirection() || reply.status == StatusCode::OK,
        "{}",
        reply.status
    );
    let reply = router
        .send(plain("GET", "/files/0123/out.txt", false))
        .await;
    assert_ne!(reply.status, StatusCode::UNAUTHORIZED);
    assert!(reply.status.is_client_error(), "{}", reply.status);
}

#[tokio::test]
async fn a_public_bind_without_keys_refuses_to_start_unless_told() {
    let test = TestEngine::new().await;
    let engine = test.engine();
    let keys = test.keys();
    let refused = snakebox_http::router(
        Arc::clone(engine),
        &config("0.0.0.0:8000"),
        keys.clone(),
        CancellationToken::new(),
    );
    let Err(err) = refused else {
        panic!("served a public address without keys");
    };
    assert!(matches!(err, HttpError::NoAuth(_)), "{err}");
    assert!(err.hint().contains("snakebox keys add"));
    // A loopback bind that clients reach under a public name (a reverse proxy) is public too.
    let mut proxied = config("127.0.0.1:8000");
    proxied.allowed_origins.clear();
    let Err(err) = snakebox_http::router(
        Arc::clone(engine),
        &proxied,
        keys.clone(),
        CancellationToken::new(),
    ) else {
        panic!("served keyless behind a public URL");
    };
    assert!(
        matches!(err, HttpError::NoAuthBehindProxy(ref host) if host == "snakebox.example.com"),
        "{err}"
    );
    assert!(err.hint().contains("--insecure-no-auth"), "{}", err.hint());
    proxied.public_url = None;
    proxied.allowed_hosts = vec!["sandbox.internal:8000".into()];
    assert!(matches!(
        snakebox_http::router(
            Arc::clone(engine),
            &proxied,
            keys.clone(),
            CancellationToken::new()
        ),
        Err(HttpError::NoAuthBehindProxy(_))
    ));
    // Loopback names stay keyless.
    proxied.public_url = Some("http://localhost:8000/".into());
    proxied.allowed_hosts = vec![
        "127.0.0.2".into(),
        "[::1]:8000".into(),
        "ui.localhost".into(),
    ];
    assert!(
        snakebox_http::router(
            Arc::clone(engine),
            &proxied,
            keys.clone(),
            CancellationToken::new()
        )
        .is_ok()
    );
    let mut insecure = config("0.0.0.0:8000");
    insecure.insecure_no_auth = true;
    assert!(
        snakebox_http::router(
            Arc::clone(engine),
            &insecure,
            keys.clone(),
            CancellationToken::new()
        )
        .is_ok()
    );
    // With a key, a public bind starts and requires it.
    let made = keys.add("team-a").unwrap();
    let router = HttpClient::of(
        snakebox_http::router(
            Arc::clone(engine),
            &config("0.0.0.0:8000"),
            keys,
            CancellationToken::new(),
        )
        .unwrap(),
        test.data_dir().to_path_buf(),
    );
    assert_eq!(
        router.send(rpc("tools/list", json!({}))).await.status,
        StatusCode::UNAUTHORIZED
    );
    let status = router
        .send(with_key(rpc("tools/list", json!({})), &made.key))
        .await
        .status;
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test]
async fn one_tenants_artifacts_and_runs_are_not_found_for_another() {
    let test = TestEngine::new().await;
    let router = router(&test);
    let a = router.with_key("team-a");
    let b = router.with_key("team-b");
    let body = a
        .call_tool(
            "execute_python",
            json!({"script": "open('out.txt', 'w').write('made by a')"}),
        )
        .await;
    let result = &body.structured;
    assert_eq!(result["status"], "ok", "{}", body.raw);
    let uri = result["artifacts"][0]["uri"].as_str().unwrap().to_owned();

    let read = json!({"uri": uri});
    let mine = a.post_mcp("resources/read", read.clone()).await.json();
    assert_eq!(mine["result"]["contents"][0]["text"], "made by a", "{mine}");
    let theirs = b.post_mcp("resources/read", read).await.json();
    assert!(
        theirs["error"]["message"]
            .as_str()
            .unwrap()
            .contains("No artifact"),
        "{theirs}"
    );
    assert!(theirs.get("result").is_none(), "{theirs}");
    // B lists nothing of A's.
    let listed = b.post_mcp("resources/list", json!({})).await.json();
    assert_eq!(listed["result"]["resources"], json!([]), "{listed}");
    let listed = a.post_mcp("resources/list", json!({})).await.json();
    assert_eq!(
        listed["result"]["resources"].as_array().unwrap().len(),
        1,
        "{listed}"
    );
}

/// Issue 32, property 5: a `Host` that is not exactly `host[:port]` is refused before any
/// route (400, with what is wrong and a hint), whatever the route.
#[tokio::test]
async fn a_host_that_is_not_one_plain_authority_is_refused_on_every_route() {
    let test = TestEngine::new().await;
    let router = router(&test);
    for path in ROUTES
        .into_iter()
        .chain(["/ui/login", "/files/e1/out.txt", "/metrics"])
    {
        for host in [
            "localhost:8000@evil.example",
            "[::1]@evil.example",
            "localhost:8000/x",
            "[::1]:8000#",
            "localhost:8000 x",
            "localhost::8000",
            "localhost:65536",
            "localhost:",
        ] {
            let request = Request::get(path)
                .header(header::HOST, host)
                .body(Body::empty())
                .unwrap();
            let reply = router.send(request).await;
            let body = reply.json();
            assert_eq!(
                reply.status,
                StatusCode::BAD_REQUEST,
                "{path} {host}: {body}"
            );
            assert!(
                body["error"]
                    .as_str()
                    .unwrap()
                    .starts_with("the Host is not a valid authority"),
                "{body}"
            );
            assert!(
                body["hint"].as_str().unwrap().contains("name[:port]"),
                "{body}"
            );
        }
    }
    // Two Host headers, or a Host that contradicts the request target: 400 too.
    let request = Request::get("/healthz")
        .header(header::HOST, "localhost")
        .header(header::HOST, "evil.example")
        .body(Body::empty())
        .unwrap();
    assert_eq!(router.send(request).await.status, StatusCode::BAD_REQUEST);
    let request = Request::get("http://evil.example/healthz")
        .header(header::HOST, "localhost")
        .body(Body::empty())
        .unwrap();
    assert_eq!(router.send(request).await.status, StatusCode::BAD_REQUEST);
}

/// Issue 32, property 5: `--max-body-bytes` is the one limit, on every route, with or
/// without a `Content-Length`: the limit passes, a byte more is 413 naming it and the setting.
#[tokio::test]
async fn the_body_limit_is_the_setting_on_every_route_with_or_without_a_length() {
    let test = TestEngine::new().await;
    let limit = 256 * 1024;
    let router = test.http_with(|http| {
        *http = config("127.0.0.1:0");
        http.insecure_no_auth = true;
        http.max_body_bytes = limit;
    });
    let ping = |size: usize| {
        let text = json!({"jsonrpc": "2.0", "id": 1, "method": "ping"}).to_string();
        let pad = size - text.len();
        format!("{} {}}}", &text[..text.len() - 1], " ".repeat(pad - 1)).into_bytes()
    };
    for chunked in [false, true] {
        for (path, content_type) in [
            ("/mcp", "application/json"),
            ("/sse", "application/json"),
            ("/messages?sessionId=0", "application/json"),
            ("/ui/login", "application/x-www-form-urlencoded"),
        ] {
            for size in [limit, limit + 1] {
                let bytes = ping(size);
                assert_eq!(bytes.len(), size);
                let body = if chunked {
                    // No Content-Length: the body is counted as it is read.
                    let chunks: Vec<Result<Vec<u8>, std::io::Error>> =
                        bytes.chunks(10_000).map(|c| Ok(c.to_vec())).collect();
                    Body::from_stream(futures_util::stream::iter(chunks))
                } else {
                    Body::from(bytes)
                };
                let mut request = Request::post(path)
                    .header(header::HOST, http::HOST)
                    .header(header::CONTENT_TYPE, content_type)
                    .header(header::ACCEPT, "application/json, text/event-stream");
                if !chunked {
                    request = request.header(header::CONTENT_LENGTH, size);
                }
                let reply = router.send(request.body(body).unwrap()).await;
                if size > limit {
                    let body = reply.json();
                    assert_eq!(
                        reply.status,
                        StatusCode::PAYLOAD_TOO_LARGE,
                        "{path} chunked={chunked}: {body}"
                    );
                    assert!(
                        body["error"]
                            .as_str()
                            .unwrap()
                            .contains("256 KiB (262144 bytes)"),
                        "{body}"
                    );
                    assert!(
                        body["hint"].as_str().unwrap().contains("--max-body-bytes"),
                        "{body}"
                    );
                } else {
                    assert_ne!(
                        reply.status,
                        StatusCode::PAYLOAD_TOO_LARGE,
                        "{path} chunked={chunked}: {}",
                        reply.text()
                    );
                }
            }
        }
    }
    // At the limit, streamable HTTP answers the ping.
    let request = Request::post("/mcp")
        .header(header::HOST, http::HOST)
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::ACCEPT, "application/json, text/event-stream")
        .body(Body::from(ping(limit)))
        .unwrap();
    let reply = router.send(request).await;
    assert_eq!(reply.json()["result"], json!({}), "{}", reply.text());
}
