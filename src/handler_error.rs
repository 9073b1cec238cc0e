//! What a handler returns on failure, for a subscription's [`Subscriber`](crate::Subscriber)
//! and an inbox's [`InboxHandler`](crate::InboxHandler) alike: both call the application's
//! code and store its error's text, so the type sits below both.

/// What a handler returns on failure: any error. A subscription retries it per the job's
/// [`RetryPolicy`](crate::RetryPolicy) and stores its message in
/// `ordo.subscriptions.last_error`; an inbox counts it as a failed attempt of the message
/// ([`InboxHandler`](crate::InboxHandler)).
pub type HandlerError = Box<dyn std::error::Error + Send + Sync>;
