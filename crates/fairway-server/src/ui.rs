//! The operators' dashboard at `/ui/`: static pages built into the binary, which read only the
//! public API, as `fairway admin` does.

use actix_web::http::header::CACHE_CONTROL;
use actix_web::{web, HttpResponse};
use rust_embed::RustEmbed;

use super::error::ApiError;

#[derive(RustEmbed)]
#[folder = "../../ui/"]
struct Assets;

pub fn routes(config: &mut web::ServiceConfig) {
    config
        // A newcomer opening the broker's address finds the dashboard.
        .service(web::redirect("/", "/ui/"))
        .service(web::redirect("/ui", "/ui/"))
        .route("/ui/", web::get().to(index))
        .route("/ui/{file}", web::get().to(asset));
}

async fn index() -> Result<HttpResponse, ApiError> {
    serve("index.html")
}

async fn asset(file: web::Path<String>) -> Result<HttpResponse, ApiError> {
    serve(&file)
}

fn serve(name: &str) -> Result<HttpResponse, ApiError> {
    let file =
        Assets::get(name).ok_or_else(|| ApiError::NoSuchRoute { path: format!("/ui/{name}") })?;
    Ok(HttpResponse::Ok()
        .content_type(file.metadata.mimetype())
        // The assets change only with the binary; a restarted broker may carry new ones.
        .insert_header((CACHE_CONTROL, "no-cache"))
        .body(file.data.into_owned()))
}
