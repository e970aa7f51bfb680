//! The web UI through the real router (a real engine on the `none` backend behind it): login
//! by key to a strict session cookie, pages that need it, CSRF and Origin on every POST, the
//! security headers, downloads that never render in the UI's origin, and one tenant's runs,
//! sessions and artifacts "not found" for another.
#![allow(clippy::unwrap_used)]

use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use serde_json::{Value, json};
use snakebox_test::http::HOST;
use snakebox_test::{HttpClient, Reply, TestEngine};

const ORIGIN: &str = "http://127.0.0.1:8000";

/// The value of a page's first CSRF field.
fn csrf_of(page: &Reply) -> String {
    let text = page.text();
    let at = text.find("name=\"csrf\" value=\"").unwrap() + "name=\"csrf\" value=\"".len();
    text[at..].split('"').next().unwrap().to_owned()
}

async fn get(router: &HttpClient, path: &str, cookie: Option<&str>) -> Reply {
    let mut request = Request::get(path).header(header::HOST, HOST);
    if let Some(cookie) = cookie {
        request = request.header(header::COOKIE, cookie);
    }
    router.send(request.body(Body::empty()).unwrap()).await
}

async fn post(
    router: &HttpClient,
    path: &str,
    cookie: Option<&str>,
    origin: Option<&str>,
    form: &str,
) -> Reply {
    let mut request = Request::post(path)
        .header(header::HOST, HOST)
        .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded");
    if let Some(cookie) = cookie {
        request = request.header(header::COOKIE, cookie);
    }
    if let Some(origin) = origin {
        request = request.header(header::ORIGIN, origin);
    }
    router
        .send(request.body(Body::from(form.to_owned())).unwrap())
        .await
}

/// Log in with `key`; the cookie to send back.
/// The page at `path`, fetched every 100 ms (at most `tries` times) until `ready` holds for it:
/// the runs table is written by a batching writer, so a row appears a moment after its call.
async fn page_when(
    router: &HttpClient,
    path: &str,
    cookie: &str,
    tries: usize,
    ready: impl Fn(&str) -> bool,
) -> String {
    let mut page = get(router, path, Some(cookie)).await.text();
    for _ in 1..tries {
        if ready(&page) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        page = get(router, path, Some(cookie)).await.text();
    }
    page
}

async fn log_in(router: &HttpClient, key: &str) -> String {
    let reply = post(
        router,
        "/ui/login",
        None,
        Some(ORIGIN),
        &format!("key={key}"),
    )
    .await;
    assert_eq!(reply.status, StatusCode::SEE_OTHER, "{}", reply.text());
    let set = reply.header(header::SET_COOKIE);
    set.split(';').next().unwrap().to_owned()
}

/// Call tool `name` as the holder of `key`; its structured result.
async fn call_tool(router: &HttpClient, key: &str, name: &str, arguments: Value) -> Value {
    router
        .presenting(key)
        .call_tool(name, arguments)
        .await
        .structured
}

#[tokio::test]
async fn login_exchanges_a_key_for_a_strict_cookie_and_pages_need_it() {
    let test = TestEngine::new().await;
    let router = test.http();
    let key = test.add_key("team-a");

    for path in ["/ui", "/ui/"] {
        let reply = get(&router, path, None).await;
        assert_eq!(reply.header(header::LOCATION), "/ui/runs", "{path}");
    }
    // Without a cookie: to the login page.
    for path in ["/ui/runs", "/ui/sessions", "/ui/environment", "/ui/clients"] {
        let reply = get(&router, path, None).await;
        assert_eq!(reply.status, StatusCode::SEE_OTHER, "{path}");
        assert_eq!(reply.header(header::LOCATION), "/ui/login", "{path}");
    }
    let login = get(&router, "/ui/login", None).await;
    assert_eq!(login.status, StatusCode::OK);
    assert!(login.text().contains("name=\"key\""));

    // A wrong key, and a login form posted from elsewhere (no Origin), are refused.
    let wrong = post(&router, "/ui/login", None, Some(ORIGIN), "key=sbx_wrong").await;
    assert_eq!(wrong.status, StatusCode::UNAUTHORIZED);
    assert!(wrong.header(header::SET_COOKIE).is_empty());
    let no_origin = post(&router, "/ui/login", None, None, &format!("key={key}")).await;
    assert_eq!(no_origin.status, StatusCode::FORBIDDEN);
    let foreign = post(
        &router,
        "/ui/login",
        None,
        Some("https://evil.example"),
        &format!("key={key}"),
    )
    .await;
    assert_eq!(foreign.status, StatusCode::FORBIDDEN);

    let reply = post(
        &router,
        "/ui/login",
        None,
        Some(ORIGIN),
        &format!("key={key}"),
    )
    .await;
    assert_eq!(reply.status, StatusCode::SEE_OTHER);
    assert_eq!(reply.header(header::LOCATION), "/ui/runs");
    let set = reply.header(header::SET_COOKIE);
    for flag in ["HttpOnly", "SameSite=Strict", "Path=/ui"] {
        assert!(set.contains(flag), "{set}");
    }
    assert!(!set.contains(&key), "the key is not the cookie: {set}");
    let cookie = set.split(';').next().unwrap();
    assert!(cookie.len() > "snakebox_ui=".len() + 60, "{cookie}");

    for path in ["/ui/runs", "/ui/sessions", "/ui/environment", "/ui/clients"] {
        let page = get(&router, path, Some(cookie)).await;
        assert_eq!(page.status, StatusCode::OK, "{path}: {}", page.text());
        let csp = page.header(header::CONTENT_SECURITY_POLICY);
        assert!(csp.contains("default-src 'self'"), "{csp}");
        assert!(csp.contains("frame-ancestors 'none'"), "{csp}");
        assert!(!csp.contains("unsafe-inline"), "{csp}");
        assert_eq!(page.header(header::X_FRAME_OPTIONS), "DENY");
        assert_eq!(page.header(header::X_CONTENT_TYPE_OPTIONS), "nosniff");
        assert_eq!(page.header(header::REFERRER_POLICY), "same-origin");
        assert!(page.text().contains("team-a"), "{path}");
        assert!(
            !page.text().contains("<script>"),
            "no inline script on {path}"
        );
        assert!(!page.text().contains("style="), "no inline style on {path}");
    }
    let clients = get(&router, "/ui/clients", Some(cookie)).await.text();
    assert!(
        clients.contains(
            "claude mcp add --scope user --transport http snakebox http://127.0.0.1:8000/mcp"
        ),
        "{clients}"
    );
    // A made-up cookie is no session.
    let forged = get(&router, "/ui/runs", Some("snakebox_ui=00ff")).await;
    assert_eq!(forged.status, StatusCode::SEE_OTHER);
}

#[tokio::test]
async fn every_post_needs_the_sessions_csrf_token_and_the_servers_origin() {
    let test = TestEngine::new().await;
    let router = test.http();
    let key = test.add_key("team-a");
    let cookie = log_in(&router, &key).await;
    let page = get(&router, "/ui/runs", Some(&cookie)).await;
    let csrf = csrf_of(&page);

    let missing = post(&router, "/ui/logout", Some(&cookie), Some(ORIGIN), "").await;
    assert_eq!(missing.status, StatusCode::FORBIDDEN, "{}", missing.text());
    assert!(missing.text().contains("CSRF"));
    let wrong = post(
        &router,
        "/ui/logout",
        Some(&cookie),
        Some(ORIGIN),
        "csrf=0000",
    )
    .await;
    assert_eq!(wrong.status, StatusCode::FORBIDDEN);
    let no_origin = post(
        &router,
        "/ui/logout",
        Some(&cookie),
        None,
        &format!("csrf={csrf}"),
    )
    .await;
    assert_eq!(no_origin.status, StatusCode::FORBIDDEN);
    // Still logged in after the refusals.
    assert_eq!(
        get(&router, "/ui/runs", Some(&cookie)).await.status,
        StatusCode::OK
    );

    let out = post(
        &router,
        "/ui/logout",
        Some(&cookie),
        Some(ORIGIN),
        &format!("csrf={csrf}"),
    )
    .await;
    assert_eq!(out.status, StatusCode::SEE_OTHER);
    assert!(out.header(header::SET_COOKIE).contains("Max-Age=0"));
    let after = get(&router, "/ui/runs", Some(&cookie)).await;
    assert_eq!(after.status, StatusCode::SEE_OTHER, "the session is gone");
}

#[tokio::test]
async fn a_revoked_key_ends_its_ui_sessions() {
    let test = TestEngine::new().await;
    let router = test.http();
    let keys = test.keys();
    let made = keys.add("team-a").unwrap();
    let cookie = log_in(&router, &made.key).await;
    assert_eq!(
        get(&router, "/ui/runs", Some(&cookie)).await.status,
        StatusCode::OK
    );
    keys.revoke(&made.info.id).unwrap();
    let after = get(&router, "/ui/runs", Some(&cookie)).await;
    assert_eq!(after.status, StatusCode::SEE_OTHER);
}

#[tokio::test]
async fn without_keys_on_loopback_the_local_tenant_needs_no_login_until_a_key_exists() {
    let test = TestEngine::new().await;
    let router = test.http();
    // A GET makes no session: the page offers a button that POSTs the login.
    let form = get(&router, "/ui/login", None).await;
    assert_eq!(form.status, StatusCode::OK);
    assert!(
        form.header(header::SET_COOKIE).is_empty(),
        "a GET made a session"
    );
    assert!(
        form.text().contains("id=\"login-local\""),
        "{}",
        form.text()
    );
    assert!(!form.text().contains("name=\"key\""));
    // Posted from elsewhere, it is refused like any login.
    let foreign = post(&router, "/ui/login", None, Some("https://evil.example"), "").await;
    assert_eq!(foreign.status, StatusCode::FORBIDDEN);
    assert!(foreign.header(header::SET_COOKIE).is_empty());
    let login = post(&router, "/ui/login", None, Some(ORIGIN), "").await;
    assert_eq!(login.status, StatusCode::SEE_OTHER);
    let set = login.header(header::SET_COOKIE);
    assert!(set.contains("HttpOnly") && set.contains("SameSite=Strict"));
    let cookie = set.split(';').next().unwrap();
    let runs = get(&router, "/ui/runs", Some(cookie)).await;
    assert_eq!(runs.status, StatusCode::OK);
    assert!(runs.text().contains("local"));
    let _ = test.add_key("team-a");
    let after = get(&router, "/ui/runs", Some(cookie)).await;
    assert_eq!(after.status, StatusCode::SEE_OTHER, "keys exist now");
    let login = get(&router, "/ui/login", None).await;
    assert_eq!(login.status, StatusCode::OK, "the login form is asked for");
    assert!(login.text().contains("name=\"key\""));
    // And an empty key is no longer the local tenant's.
    let empty = post(&router, "/ui/login", None, Some(ORIGIN), "key=").await;
    assert_eq!(empty.status, StatusCode::UNAUTHORIZED);
    assert!(empty.header(header::SET_COOKIE).is_empty());
}

#[tokio::test]
async fn runs_show_their_output_and_artifacts_download_without_rendering() {
    let test = TestEngine::new().await;
    let router = test.http();
    let key = test.add_key("team-a");
    let script = "print('hello <b>ui</b>')\n\
        open('evil.svg', 'w').write('<svg xmlns=\"http://www.w3.org/2000/svg\"><script>alert(1)</script></svg>')\n";
    let result = call_tool(&router, &key, "execute_python", json!({"script": script})).await;
    assert_eq!(result["status"], "ok", "{result}");
    let id = result["execution_id"].as_str().unwrap().to_owned();
    let cookie = log_in(&router, &key).await;

    let list = get(&router, "/ui/runs", Some(&cookie)).await.text();
    assert!(list.contains(&format!("/ui/runs/{id}")), "{list}");
    let page = get(&router, &format!("/ui/runs/{id}"), Some(&cookie)).await;
    assert_eq!(page.status, StatusCode::OK);
    let html = page.text();
    // stdout, escaped.
    assert!(html.contains("hello &#60;b&#62;ui&#60;/b&#62;"), "{html}");
    assert!(!html.contains("<b>ui</b>"), "{html}");
    assert!(html.contains(&format!("/ui/runs/{id}/download/evil.svg")));
    assert!(
        !html.contains(&format!("/ui/runs/{id}/image/evil.svg")),
        "an SVG is never shown inline"
    );

    let svg = get(
        &router,
        &format!("/ui/runs/{id}/download/evil.svg"),
        Some(&cookie),
    )
    .await;
    assert_eq!(svg.status, StatusCode::OK);
    assert!(
        svg.header(header::CONTENT_DISPOSITION)
            .starts_with("attachment; filename=\"evil.svg\"")
    );
    assert_eq!(svg.header(header::CONTENT_TYPE), "application/octet-stream");
    assert_eq!(svg.header(header::X_CONTENT_TYPE_OPTIONS), "nosniff");
    assert!(
        svg.header(header::CONTENT_SECURITY_POLICY)
            .starts_with("sandbox")
    );
    // A download's own, stricter referrer policy is kept (the UI's pages send the path to
    // their own origin only).
    assert_eq!(svg.header(header::REFERRER_POLICY), "no-referrer");
    assert!(
        svg.text().contains("<script>alert(1)</script>"),
        "exact bytes"
    );
    // Asked for as an image, it is refused: not a raster image.
    let inline = get(
        &router,
        &format!("/ui/runs/{id}/image/evil.svg"),
        Some(&cookie),
    )
    .await;
    assert_eq!(inline.status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
    // Paths outside the run are not found.
    let escape = get(
        &router,
        &format!("/ui/runs/{id}/download/..%2F..%2Fstore-v1.db"),
        Some(&cookie),
    )
    .await;
    assert_eq!(escape.status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn a_second_tenant_sees_none_of_the_firsts_runs_sessions_or_artifacts() {
    let test = TestEngine::new().await;
    let router = test.http();
    let a = test.add_key("team-a");
    let b = test.add_key("team-b");
    let result = call_tool(
        &router,
        &a,
        "execute_python",
        json!({"script": "print('secret of a'); open('out.txt', 'w').write('a')"}),
    )
    .await;
    let run = result["execution_id"].as_str().unwrap().to_owned();
    let created = call_tool(&router, &a, "create_session", json!({"name": "a-session"})).await;
    let session = created["session_id"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(!session.is_empty(), "{created}");
    call_tool(
        &router,
        &a,
        "write_file",
        json!({"session_id": session, "path": "notes.txt", "content": "a's notes"}),
    )
    .await;

    let cookie_a = log_in(&router, &a).await;
    let sessions_a = get(&router, "/ui/sessions", Some(&cookie_a)).await.text();
    assert!(sessions_a.contains("a-session"), "{sessions_a}");
    let file = get(
        &router,
        &format!("/ui/sessions/{session}/download/notes.txt"),
        Some(&cookie_a),
    )
    .await;
    assert_eq!(file.text(), "a's notes");

    let cookie_b = log_in(&router, &b).await;
    let runs_b = get(&router, "/ui/runs", Some(&cookie_b)).await.text();
    assert!(!runs_b.contains(&run), "{runs_b}");
    let sessions_b = get(&router, "/ui/sessions", Some(&cookie_b)).await.text();
    assert!(!sessions_b.contains("a-session"), "{sessions_b}");
    for path in [
        format!("/ui/runs/{run}"),
        format!("/ui/runs/{run}/download/out.txt"),
        format!("/ui/runs/{run}/image/out.txt"),
        format!("/ui/sessions/{session}"),
        format!("/ui/sessions/{session}/delete"),
        format!("/ui/sessions/{session}/download/notes.txt"),
    ] {
        let reply = get(&router, &path, Some(&cookie_b)).await;
        assert_eq!(reply.status, StatusCode::NOT_FOUND, "{path}");
        assert!(!reply.text().contains("secret of a"), "{path}");
    }
    // The environment page shows session counts, not A's sessions.
    let environment = get(&router, "/ui/environment", Some(&cookie_b))
        .await
        .text();
    assert!(!environment.contains(&session), "{environment}");
    assert!(!environment.contains("a-session"), "{environment}");
    // B cannot delete A's session, even with a valid form of its own.
    let csrf_b = csrf_of(&get(&router, "/ui/runs", Some(&cookie_b)).await);
    let delete = post(
        &router,
        &format!("/ui/sessions/{session}/delete"),
        Some(&cookie_b),
        Some(ORIGIN),
        &format!("csrf={csrf_b}"),
    )
    .await;
    assert_eq!(delete.status, StatusCode::NOT_FOUND);
    let reset = post(
        &router,
        &format!("/ui/sessions/{session}/reset"),
        Some(&cookie_b),
        Some(ORIGIN),
        &format!("csrf={csrf_b}"),
    )
    .await;
    assert_eq!(reset.status, StatusCode::NOT_FOUND);

    // A resets it after confirming: the workspace is empty again, the id stays.
    let confirm = get(
        &router,
        &format!("/ui/sessions/{session}/reset"),
        Some(&cookie_a),
    )
    .await;
    assert_eq!(confirm.status, StatusCode::OK);
    assert!(confirm.text().contains("id=\"confirm-reset\""));
    let reset = post(
        &router,
        &format!("/ui/sessions/{session}/reset"),
        Some(&cookie_a),
        Some(ORIGIN),
        &format!("csrf={}", csrf_of(&confirm)),
    )
    .await;
    assert_eq!(reset.status, StatusCode::SEE_OTHER, "{}", reset.text());
    assert_eq!(
        reset.header(header::LOCATION),
        format!("/ui/sessions/{session}")
    );
    let file = get(
        &router,
        &format!("/ui/sessions/{session}/download/notes.txt"),
        Some(&cookie_a),
    )
    .await;
    assert_eq!(
        file.status,
        StatusCode::NOT_FOUND,
        "the workspace was emptied"
    );

    // A deletes it: the confirmation page's form, then it is gone.
    let confirm = get(
        &router,
        &format!("/ui/sessions/{session}/delete"),
        Some(&cookie_a),
    )
    .await;
    assert_eq!(confirm.status, StatusCode::OK);
    let missing = post(
        &router,
        &format!("/ui/sessions/{session}/delete"),
        Some(&cookie_a),
        Some(ORIGIN),
        "",
    )
    .await;
    assert_eq!(missing.status, StatusCode::FORBIDDEN, "no CSRF token");
    let deleted = post(
        &router,
        &format!("/ui/sessions/{session}/delete"),
        Some(&cookie_a),
        Some(ORIGIN),
        &format!("csrf={}", csrf_of(&confirm)),
    )
    .await;
    assert_eq!(deleted.status, StatusCode::SEE_OTHER, "{}", deleted.text());
    let sessions_a = get(&router, "/ui/sessions", Some(&cookie_a)).await.text();
    assert!(!sessions_a.contains("a-session"), "{sessions_a}");
}

#[tokio::test]
async fn a_running_runs_output_streams_live_and_it_is_cancelled_by_its_tenant_only() {
    let test = TestEngine::new().await;
    let router = test.http();
    let a = test.add_key("team-a");
    let b = test.add_key("team-b");
    let started = std::time::Instant::now();
    let long = {
        let (router, a) = (router.clone(), a.clone());
        tokio::spawn(async move {
            let script = "import time\nprint('started', flush=True)\ntime.sleep(60)\n";
            call_tool(&router, &a, "execute_python", json!({"script": script})).await
        })
    };
    let cookie_a = log_in(&router, &a).await;
    let list = page_when(&router, "/ui/runs", &cookie_a, 300, |list| {
        list.contains("status running")
    })
    .await;
    assert!(list.contains("status running"), "{list}");
    let at = list.find("href=\"/ui/runs/").unwrap() + "href=\"/ui/runs/".len();
    let id = list[at..].split('"').next().unwrap().to_owned();
    let page = get(&router, &format!("/ui/runs/{id}"), Some(&cookie_a)).await;
    assert!(page.text().contains("id=\"cancel\""), "{}", page.text());
    let csrf_a = csrf_of(&page);

    // Its output streams live, as Server-Sent Events.
    let request = Request::get(format!("/ui/runs/{id}/live"))
        .header(header::HOST, HOST)
        .header(header::COOKIE, &cookie_a)
        .body(Body::empty())
        .unwrap();
    let response = router.response(request).await;
    assert_eq!(response.status(), StatusCode::OK);
    assert!(
        response.headers()[header::CONTENT_TYPE]
            .to_str()
            .unwrap()
            .starts_with("text/event-stream")
    );
    let mut stream = response.into_body().into_data_stream();
    let mut seen = String::new();
    let streamed = tokio::time::timeout(std::time::Duration::from_secs(30), async {
        while let Some(chunk) = futures_util::StreamExt::next(&mut stream).await {
            seen.push_str(&String::from_utf8_lossy(&chunk.unwrap()));
            if seen.contains("started") {
                return;
            }
        }
    })
    .await;
    assert!(streamed.is_ok(), "{seen}");
    assert!(seen.contains("event: output"), "{seen}");

    // A stream whose login ends (here, a log-out) ends too, while the run goes on.
    let cookie_a2 = log_in(&router, &a).await;
    let csrf_a2 = csrf_of(&get(&router, "/ui/runs", Some(&cookie_a2)).await);
    let request = Request::get(format!("/ui/runs/{id}/live"))
        .header(header::HOST, HOST)
        .header(header::COOKIE, &cookie_a2)
        .body(Body::empty())
        .unwrap();
    let mut stream_a2 = router
        .response(request)
        .await
        .into_body()
        .into_data_stream();
    let out = post(
        &router,
        "/ui/logout",
        Some(&cookie_a2),
        Some(ORIGIN),
        &format!("csrf={csrf_a2}"),
    )
    .await;
    assert_eq!(out.status, StatusCode::SEE_OTHER);
    let mut seen_a2 = String::new();
    let ended = tokio::time::timeout(std::time::Duration::from_secs(30), async {
        while let Some(chunk) = futures_util::StreamExt::next(&mut stream_a2).await {
            seen_a2.push_str(&String::from_utf8_lossy(&chunk.unwrap()));
            if seen_a2.contains("event: end") {
                return;
            }
        }
    })
    .await;
    assert!(ended.is_ok(), "{seen_a2}");
    assert!(
        !long.is_finished(),
        "the run goes on after its viewer logged out"
    );

    // B cannot cancel it, even with a valid form of its own; A needs its token.
    let cookie_b = log_in(&router, &b).await;
    let csrf_b = csrf_of(&get(&router, "/ui/runs", Some(&cookie_b)).await);
    let cancel = format!("/ui/runs/{id}/cancel");
    let theirs = post(
        &router,
        &cancel,
        Some(&cookie_b),
        Some(ORIGIN),
        &format!("csrf={csrf_b}"),
    )
    .await;
    assert_eq!(theirs.status, StatusCode::NOT_FOUND);
    let live_b = get(&router, &format!("/ui/runs/{id}/live"), Some(&cookie_b)).await;
    assert_eq!(live_b.status, StatusCode::NOT_FOUND);
    let no_token = post(&router, &cancel, Some(&cookie_a), Some(ORIGIN), "").await;
    assert_eq!(no_token.status, StatusCode::FORBIDDEN);
    assert!(!long.is_finished(), "still running after the refusals");

    let mine = post(
        &router,
        &cancel,
        Some(&cookie_a),
        Some(ORIGIN),
        &format!("csrf={csrf_a}"),
    )
    .await;
    assert_eq!(mine.status, StatusCode::SEE_OTHER, "{}", mine.text());
    let result = long.await.unwrap();
    // The live stream says the run ended.
    let ended = tokio::time::timeout(std::time::Duration::from_secs(10), async {
        while let Some(chunk) = futures_util::StreamExt::next(&mut stream).await {
            seen.push_str(&String::from_utf8_lossy(&chunk.unwrap()));
            if seen.contains("event: end") {
                return;
            }
        }
    })
    .await;
    assert!(ended.is_ok(), "{seen}");
    assert_eq!(result["status"], "cancelled", "{result}");
    assert!(started.elapsed() < std::time::Duration::from_secs(40));
    // The runs table is written by a batching writer: the row says `cancelled` a moment
    // after the call returned.
    let page = page_when(&router, &format!("/ui/runs/{id}"), &cookie_a, 50, |page| {
        page.contains(">cancelled<")
    })
    .await;
    assert!(page.contains(">cancelled<"), "{page}");
    // Ended: nothing left to cancel.
    let again = post(
        &router,
        &cancel,
        Some(&cookie_a),
        Some(ORIGIN),
        &format!("csrf={csrf_a}"),
    )
    .await;
    assert_eq!(again.status, StatusCode::NOT_FOUND);
}

fn multipart(csrf: Option<&str>, name: &str, data: &[u8]) -> (String, Vec<u8>) {
    let boundary = "snakeboxtestboundary";
    let mut body = Vec::new();
    if let Some(csrf) = csrf {
        body.extend_from_slice(
            format!(
                "--{boundary}\r\nContent-Disposition: form-data; name=\"csrf\"\r\n\r\n{csrf}\r\n"
            )
            .as_bytes(),
        );
    }
    body.extend_from_slice(
        format!(
            "--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{name}\"\r\nContent-Type: application/octet-stream\r\n\r\n"
        )
        .as_bytes(),
    );
    body.extend_from_slice(data);
    body.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
    (format!("multipart/form-data; boundary={boundary}"), body)
}

async fn upload(router: &HttpClient, path: &str, cookie: &str, form: (String, Vec<u8>)) -> Reply {
    let request = Request::post(path)
        .header(header::HOST, HOST)
        .header(header::ORIGIN, ORIGIN)
        .header(header::COOKIE, cookie)
        .header(header::CONTENT_TYPE, form.0)
        .body(Body::from(form.1))
        .unwrap();
    router.send(request).await
}

#[tokio::test]
async fn files_are_uploaded_into_a_session_by_its_tenant_only() {
    let test = TestEngine::new().await;
    let router = test.http();
    let a = test.add_key("team-a");
    let b = test.add_key("team-b");
    let created = call_tool(&router, &a, "create_session", json!({})).await;
    let session = created["session_id"].as_str().unwrap().to_owned();
    let bytes: Vec<u8> = (0..=255u8).cycle().take(3000).collect();
    let target = format!("/ui/sessions/{session}/upload");

    let cookie_a = log_in(&router, &a).await;
    let csrf_a = csrf_of(&get(&router, &format!("/ui/sessions/{session}"), Some(&cookie_a)).await);
    let no_token = upload(
        &router,
        &target,
        &cookie_a,
        multipart(None, "up.bin", &bytes),
    )
    .await;
    assert_eq!(no_token.status, StatusCode::FORBIDDEN);
    let cookie_b = log_in(&router, &b).await;
    let csrf_b = csrf_of(&get(&router, "/ui/runs", Some(&cookie_b)).await);
    let theirs = upload(
        &router,
        &target,
        &cookie_b,
        multipart(Some(&csrf_b), "up.bin", &bytes),
    )
    .await;
    assert_eq!(theirs.status, StatusCode::NOT_FOUND);

    let mine = upload(
        &router,
        &target,
        &cookie_a,
        multipart(Some(&csrf_a), "up.bin", &bytes),
    )
    .await;
    assert_eq!(mine.status, StatusCode::SEE_OTHER, "{}", mine.text());
    let back = get(
        &router,
        &format!("/ui/sessions/{session}/download/up.bin"),
        Some(&cookie_a),
    )
    .await;
    assert_eq!(back.body, bytes);
    let listed = get(&router, &format!("/ui/sessions/{session}"), Some(&cookie_a)).await;
    assert!(listed.text().contains("up.bin"));
    // A name that leaves the workspace is refused.
    let escape = upload(
        &router,
        &target,
        &cookie_a,
        multipart(Some(&csrf_a), "../../escape.bin", &bytes),
    )
    .await;
    assert_eq!(escape.status, StatusCode::BAD_REQUEST, "{}", escape.text());
}

#[tokio::test]
async fn the_ui_is_behind_the_edges_host_and_origin_checks() {
    let test = TestEngine::new().await;
    let router = test.http();
    let key = test.add_key("team-a");
    for path in ["/ui", "/ui/", "/ui/login", "/ui/runs", "/ui/static/ui.css"] {
        let request = Request::get(path)
            .header(header::HOST, "evil.example")
            .body(Body::empty())
            .unwrap();
        assert_eq!(
            router.send(request).await.status,
            StatusCode::FORBIDDEN,
            "{path}"
        );
    }
    // A page of another origin cannot log in (DNS rebinding or a cross-site form).
    let request = Request::post("/ui/login")
        .header(header::HOST, "evil.example")
        .header(header::ORIGIN, "http://evil.example")
        .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
        .body(Body::from(format!("key={key}")))
        .unwrap();
    let reply = router.send(request).await;
    assert_eq!(reply.status, StatusCode::FORBIDDEN);
    assert!(reply.header(header::SET_COOKIE).is_empty());
    // The static files are there for an allowed host, and carry the policy too.
    let css = get(&router, "/ui/static/ui.css", None).await;
    assert_eq!(css.status, StatusCode::OK);
    assert!(css.header(header::CONTENT_TYPE).starts_with("text/css"));
    assert!(!css.header(header::CONTENT_SECURITY_POLICY).is_empty());
}

#[tokio::test]
async fn the_runs_list_pages_back_and_a_session_page_lists_its_own_cells() {
    let test = TestEngine::new().await;
    let router = test.http();
    let key = test.add_key("team-a");
    let session = call_tool(&router, &key, "create_session", json!({})).await;
    let sid = session["session_id"].as_str().unwrap().to_owned();
    let mut ids = Vec::new();
    for script in ["print(1)", "print(2)", "print(3)"] {
        let result = call_tool(&router, &key, "execute_python", json!({"script": script})).await;
        ids.push(result["execution_id"].as_str().unwrap().to_owned());
    }
    let cell = call_tool(
        &router,
        &key,
        "execute_python",
        json!({"script": "x = 1", "session_id": sid}),
    )
    .await;
    let cell_id = cell["execution_id"].as_str().unwrap().to_owned();
    let cookie = log_in(&router, &key).await;
    // The runs table is written by a batching writer: wait until the cell is listed.
    let list = page_when(&router, "/ui/runs", &cookie, 50, |list| {
        list.contains(&cell_id)
    })
    .await;
    assert!(ids.iter().all(|id| list.contains(id.as_str())), "{list}");
    // The page before the newest one-shot run: the two older ones, not it, not the cell.
    let older = get(
        &router,
        &format!("/ui/runs?before={}", ids[2]),
        Some(&cookie),
    )
    .await
    .text();
    assert!(
        older.contains(&ids[0]) && older.contains(&ids[1]),
        "{older}"
    );
    assert!(
        !older.contains(&ids[2]) && !older.contains(&cell_id),
        "{older}"
    );
    // A session's page lists its cell and none of the one-shot runs.
    let page = get(&router, &format!("/ui/sessions/{sid}"), Some(&cookie))
        .await
        .text();
    assert!(page.contains(&cell_id), "{page}");
    assert!(ids.iter().all(|id| !page.contains(id.as_str())), "{page}");
}
