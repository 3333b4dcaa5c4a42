//! The Bot API at one base URL with one token (HTTPS through reqwest, no proxy): each call, its
//! answer read with a bound, and the failures told apart (wait, retry later, or give up). The
//! token is only ever part of the request URL, which no error shows.

use super::*;

/// A Bot API failure.
#[derive(Debug)]
pub(super) enum ApiError {
    /// 429: wait this many seconds.
    RetryAfter(u64),
    /// The request did not get an answer (connect, timeout, a 5xx): retry later.
    Network(String),
    /// Telegram refused it (`error_code`, `description`): retrying changes nothing.
    Refused(i64, String),
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ApiError::RetryAfter(seconds) => {
                write!(f, "too many requests: retry after {seconds} s")
            }
            ApiError::Network(why) => write!(f, "network: {why}"),
            ApiError::Refused(code, description) => write!(f, "refused ({code}): {description}"),
        }
    }
}

/// The Bot API at one base URL with one token.
pub(super) struct Api {
    pub(super) client: reqwest::Client,
    /// `<api_base>/bot<token>/`: secret.
    pub(super) base: ChannelSecret,
}

impl Api {
    pub(super) fn new(settings: &Settings, token: &ChannelSecret) -> Result<Api, Error> {
        let client = reqwest::Client::builder()
            .no_proxy()
            .connect_timeout(Duration::from_secs(10))
            .timeout(settings.poll_timeout + Duration::from_secs(20))
            .build()
            .map_err(|error| {
                Error::Failed(format!("cannot build the Telegram HTTP client: {error}"))
            })?;
        Ok(Api {
            client,
            base: ChannelSecret::new(format!("{}/bot{}/", settings.api_base, token.expose())),
        })
    }

    pub(super) async fn call(&self, method: &str, body: &Value) -> Result<Value, ApiError> {
        let response = self
            .client
            .post(format!("{}{method}", self.base.expose()))
            .header("content-type", "application/json")
            .body(body.to_string())
            .send()
            .await
            // The URL holds the token: errors never carry it.
            .map_err(|error| ApiError::Network(error.without_url().to_string()))?;
        let status = response.status().as_u16();
        let mut response = response;
        let mut bytes = Vec::new();
        while let Some(chunk) = response
            .chunk()
            .await
            .map_err(|error| ApiError::Network(error.without_url().to_string()))?
        {
            if bytes.len() + chunk.len() > MAX_ANSWER_BYTES {
                return Err(ApiError::Network(format!(
                    "the answer to {method} is larger than {} MiB",
                    MAX_ANSWER_BYTES >> 20
                )));
            }
            bytes.extend_from_slice(&chunk);
        }
        let answer: Value = match serde_json::from_slice(&bytes) {
            Ok(answer) => answer,
            Err(_) if status >= 500 || status == 429 => {
                return Err(ApiError::Network(format!("HTTP {status}")));
            }
            Err(_) => {
                return Err(ApiError::Refused(
                    i64::from(status),
                    format!("HTTP {status} with a body that is not the Bot API's JSON"),
                ));
            }
        };
        if answer.get("ok") == Some(&Value::Bool(true)) {
            return Ok(answer.get("result").cloned().unwrap_or(Value::Null));
        }
        let code = answer
            .get("error_code")
            .and_then(Value::as_i64)
            .unwrap_or(i64::from(status));
        if code == 429 {
            let after = answer
                .pointer("/parameters/retry_after")
                .and_then(Value::as_u64)
                .unwrap_or(1);
            return Err(ApiError::RetryAfter(after));
        }
        let description: String = answer
            .get("description")
            .and_then(Value::as_str)
            .unwrap_or("no description")
            .chars()
            .take(300)
            .collect();
        if code >= 500 {
            return Err(ApiError::Network(format!("{code}: {description}")));
        }
        Err(ApiError::Refused(code, description))
    }
}
