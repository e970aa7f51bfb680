//! Signed download links and `/metrics`, through the real router (a real engine on the `none`
//! backend behind it): a run's result carries a link that downloads the exact bytes with the
//! safe headers and no key; a tampered signature is 403, an expired link 410, `..` 404, and
//! a link re-signed for another tenant opens nothing (the store's owner check); `/metrics`
//! is Prometheus text whose run counter grows with a run.
#![allow(clippy::unwrap_used)]

use std::time::{SystemTime, UNIX_EPOCH};

use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use serde_json::{Value, json};
use snakebox_http::LinkSigner;
use snakebox_test::http::get;
use snakebox_test::{HttpClient, Reply, TestEngine};

fn router(test: &TestEngine, public_url: Option<&str>) -> HttpClient {
    test.http_with(|http| http.public_url = public_url.map(str::to_owned))
}

/// Run `script` as `client` (with its key); the call's result.
async fn run(client: &HttpClient, script: &str) -> Value {
    let result = client
        .call_tool("execute_python", json!({"script": script}))
        .await
        .raw;
    assert_eq!(result["structuredContent"]["status"], "ok", "{result}");
    result
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// The path and query of a URL (what a client sends after the host).
fn path_of(url: &str) -> &str {
    let rest = url.split_once("://").unwrap().1;
    &rest[rest.find('/').unwrap()..]
}

const SCRIPT: &str = "import os\nos.makedirs('out', exist_ok=True)\nopen('out/data b.bin', 'wb').write(bytes(range(256)) * 3)";

#[tokio::test]
async fn a_results_link_downloads_the_exact_bytes_without_a_key_and_nothing_else() {
    let test = TestEngine::new().await;
    let router = router(&test, None);
    let a = router.with_key("team-a");
    let result = run(&a, SCRIPT).await;
    let artifact = &result["structuredContent"]["artifacts"][0];
    assert_eq!(artifact["name"], "out/data b.bin", "{result}");
    let url = artifact["download_url"].as_str().unwrap().to_owned();
    // Built from the Host the client reached; no key in it.
    assert!(url.starts_with("http://127.0.0.1:8000/files/"), "{url}");
    assert!(
        url.contains("/out/data%20b.bin?tenant=team-a&exp="),
        "{url}"
    );
    assert!(!url.contains(&a.key()[4..]), "{url}");
    // The text form and the resource link say it too.
    let text = result["content"][0]["text"].as_str().unwrap();
    assert!(text.contains(&format!("download: {url}")), "{text}");
    let link = result["content"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "resource_link")
        .unwrap();
    assert!(
        link["description"].as_str().unwrap().contains(&url),
        "{link}"
    );

    // A plain GET, no key: the bytes and the headers.
    let expected: Vec<u8> = (0..=255u8).cycle().take(768).collect();
    let Reply {
        status,
        headers,
        body,
    } = router.send(get(path_of(&url))).await;
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
    assert_eq!(body, expected);
    assert_eq!(headers[header::CONTENT_LENGTH], "768");
    assert_eq!(headers[header::X_CONTENT_TYPE_OPTIONS], "nosniff");
    assert_eq!(
        headers[header::CONTENT_SECURITY_POLICY],
        "sandbox; default-src 'none'"
    );
    let disposition = headers[header::CONTENT_DISPOSITION].to_str().unwrap();
    assert!(
        disposition.starts_with("attachment; filename=\"data_b.bin\""),
        "{disposition}"
    );
    assert!(
        disposition.contains("filename*=UTF-8''data%20b.bin"),
        "{disposition}"
    );

    // HEAD answers the same head, without the body.
    let head = Request::head(path_of(&url))
        .header(header::HOST, "127.0.0.1:8000")
        .body(Body::empty())
        .unwrap();
    let Reply {
        status,
        headers: head_headers,
        body,
    } = router.send(head).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(head_headers[header::CONTENT_LENGTH], "768");
    assert!(body.is_empty());

    // Tampered: another signature, another path, another expiry, no signature at all.
    let path = path_of(&url).to_owned();
    let (base, sig) = path.rsplit_once("&sig=").unwrap();
    let flipped = format!(
        "{base}&sig={}{}",
        if sig.starts_with('0') { '1' } else { '0' },
        &sig[1..]
    );
    let later = {
        let (head, exp) = base.rsplit_once("&exp=").unwrap();
        format!("{head}&exp={}&sig={sig}", exp.parse::<u64>().unwrap() + 1)
    };
    for tampered in [
        flipped,
        path.replace("data%20b.bin", "data%20c.bin"),
        later,
        base.to_owned(),
        path.split('?').next().unwrap().to_owned(),
        path.replace("tenant=team-a", "tenant=team-b"),
    ] {
        let Reply { status, body, .. } = router.send(get(&tampered)).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{tampered}");
        let body: Value = serde_json::from_slice(&body).unwrap();
        assert!(
            body["hint"].as_str().unwrap().contains("download_url"),
            "{body}"
        );
    }

    // Links signed with the server's secret (it lives in the data directory), as a client
    // could not: expired → 410; `..` → 404; another tenant's artifact → 404.
    let signer = LinkSigner::load_or_create(test.data_dir()).unwrap();
    let execution_id = result["structuredContent"]["execution_id"]
        .as_str()
        .unwrap();
    let expired = signer.link("team-a", execution_id, "out/data b.bin", now() - 1);
    let Reply { status, .. } = router.send(get(&expired)).await;
    assert_eq!(status, StatusCode::GONE);
    for dotted in ["../manifest.json", "out/../out/data b.bin", "/etc/passwd"] {
        let link = signer.link("team-a", execution_id, dotted, now() + 60);
        let Reply { status, .. } = router.send(get(&link)).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{link}");
    }
    let Reply { status, .. } = router
        .send(get(&format!(
            "/files/{execution_id}/..?tenant=team-a&exp=1&sig=00"
        )))
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let unknown = signer.link("team-a", execution_id, "out/none.bin", now() + 60);
    assert_eq!(
        router.send(get(&unknown)).await.status,
        StatusCode::NOT_FOUND
    );
    let _ = test.add_key("team-b");
    let theirs = signer.link("team-b", execution_id, "out/data b.bin", now() + 60);
    assert_eq!(
        router.send(get(&theirs)).await.status,
        StatusCode::NOT_FOUND
    );
    // The link still works, and is refused for a foreign Host like every route.
    let mut foreign = get(&path);
    foreign
        .headers_mut()
        .insert(header::HOST, "evil.example".parse().unwrap());
    assert_eq!(router.send(foreign).await.status, StatusCode::FORBIDDEN);
    assert_eq!(router.send(get(&path)).await.status, StatusCode::OK);
}

#[tokio::test]
async fn links_use_the_public_url_and_survive_a_restart() {
    let test = TestEngine::new().await;
    // Published under a public URL, the server needs a key before it starts.
    let key = test.add_key("team-a");
    let first = router(&test, Some("https://snakebox.example.com/")).presenting(&key);
    let result = run(&first, SCRIPT).await;
    let url = result["structuredContent"]["artifacts"][0]["download_url"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        url.starts_with("https://snakebox.example.com/files/"),
        "{url}"
    );
    // A new server of the same data directory: the same secret.
    let second = router(&test.restart().await, None);
    let Reply { status, body, .. } = second.send(get(path_of(&url))).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body.len(), 768);
}

/// The value of the sample `name{labels}` in Prometheus text (0 when absent).
fn sample(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| line.rsplit_once(' '))
        .filter(|(series, _)| {
            series.starts_with(&format!("{name}{{"))
                && labels
                    .iter()
                    .all(|(k, v)| series.contains(&format!("{k}=\"{v}\"")))
        })
        .map(|(_, value)| value.parse::<f64>().unwrap())
        .sum()
}

#[tokio::test]
async fn metrics_are_prometheus_text_and_count_runs() {
    let test = TestEngine::new().await;
    let router = router(&test, None);
    // No key yet on loopback: open, like every route.
    let Reply {
        status,
        headers,
        body: before,
    } = router.send(get("/metrics")).await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        headers[header::CONTENT_TYPE]
            .to_str()
            .unwrap()
            .starts_with("text/plain; version=0.0.4"),
        "{headers:?}"
    );
    let before = String::from_utf8(before).unwrap();
    assert!(
        before.contains("# TYPE snakebox_sessions gauge"),
        "{before}"
    );
    assert!(before.contains("snakebox_sandbox_slots "), "{before}");
    let ok_runs = |text: &str| {
        sample(
            text,
            "snakebox_runs_total",
            &[("kind", "execute"), ("status", "ok")],
        )
    };

    // Once a key exists, /metrics needs one, as every route does.
    let holder = router.with_key("team-a");
    let key = holder.key();
    assert_eq!(
        router.send(get("/metrics")).await.status,
        StatusCode::UNAUTHORIZED
    );
    run(&holder, "print('counted')").await;
    let Reply {
        status,
        body: after,
        ..
    } = holder.get("/metrics").await;
    assert_eq!(status, StatusCode::OK);
    let after = String::from_utf8(after).unwrap();
    // Other tests of this process run too (one recorder per process): more, not exactly one.
    assert!(ok_runs(&after) >= ok_runs(&before) + 1.0, "{after}");
    assert!(
        after.contains("# TYPE snakebox_runs_total counter"),
        "{after}"
    );
    assert!(
        after.contains("snakebox_run_duration_seconds_bucket{kind=\"execute\""),
        "{after}"
    );
    assert!(
        sample(
            &after,
            "snakebox_http_requests_total",
            &[("route", "/mcp"), ("status", "200")]
        ) >= 1.0,
        "{after}"
    );
    // No tenant, script or key in any series.
    for secret in ["team-a", "counted", &key[4..]] {
        assert!(!after.contains(secret), "{secret} in {after}");
    }
}
