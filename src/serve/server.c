/* The server's life: start (model, tokenizer, the engine, listening), stop
 * (drain, cancel, close), destroy. */
#include "serve/server.h"

#include "core/core.h"

#include <stdio.h>
#include <string.h>
#include <time.h>

og_serve_params og_serve_default_params(void) {
    og_serve_params p;
    memset(&p, 0, sizeof p);
    p.model = og_model_default_params();
    p.session = og_session_default_params();
    p.host = "127.0.0.1";
    p.port = 8080;
    p.max_sessions = 0; /* by the back end: og_serve_resolve_params */
    p.kv_budget = 0;
    p.prefix_cache_bytes = og_prefix_cache_default_params().budget_bytes;
    p.max_queue = 256;
    p.max_body = 1 << 20;
    p.chunk = 256;
    p.step_rows = 512;
    p.shutdown_grace_s = 5;
    p.max_connections = -1;
    p.max_connections_per_ip = -1;
    p.header_timeout_s = 10;
    p.min_body_rate = 16 << 10;
    p.write_timeout_s = 30;
    return p;
}

void og_serve_resolve_params(og_serve_params *p) {
    /* docs/decisions.md, "Sessions at once by back end": a GPU's batched
       step costs little more per session up to a few hundred (256 streams
       of the 0.6B shape served 35.4k tok/s against 19.8k at 64); the CPU's
       grows with every session */
    if (p->max_sessions == 0)
        p->max_sessions = og_model_params_backend(&p->model) == OG_BACKEND_CUDA ? OG_SERVE_SESSIONS_CUDA
                                                                                : OG_SERVE_SESSIONS_CPU;
    /* docs/decisions.md, "Slow and idle clients": one address may hold every
       request the server admits (running and waiting) and 64 connections
       more, to be answered 429 or to ask /health; the total holds the
       admitted requests of everyone and one address at its bound besides,
       with 128 to spare */
    const int64_t in_flight = (int64_t)p->max_sessions + p->max_queue, per_ip = in_flight + 64,
                  total = in_flight + per_ip + 128;
    if (p->max_connections < 0) p->max_connections = (int32_t)(total < 1 << 20 ? total : 1 << 20);
    if (p->max_connections_per_ip < 0) p->max_connections_per_ip = (int32_t)(per_ip < 1 << 20 ? per_ip : 1 << 20);
}

static char *model_id_of(const char *path) {
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    char *id = og_strdup(*base ? base : "model");
    if (!id) return NULL;
    char *dot = strrchr(id, '.');
    if (dot && dot != id) *dot = 0;
    return id;
}

void og_server_stop(og_server *s) {
    if (!s || s->stopped) return;
    pthread_mutex_lock(&s->lock);
    s->stopping = true;
    pthread_mutex_unlock(&s->lock);
    og_http_quiesce(s);
    /* waiting requests end (503), running ones get the grace, then are
       cancelled (a stream ends with an error event and [DONE]) */
    og_engine_stop(s->engine, s->p.shutdown_grace_s);
    /* let the last responses reach their clients */
    pthread_mutex_lock(&s->lock);
    const double flush_end = og_time_now() + 2;
    while (s->active_responses > 0 && og_time_now() < flush_end)
        og_cond_wait_until(&s->idle_cond, &s->lock, flush_end);
    pthread_mutex_unlock(&s->lock);
    og_http_stop(s);
    s->stopped = true;
}

void og_server_destroy(og_server *s) {
    if (!s) return;
    og_server_stop(s);
    og_engine_destroy(s->engine); /* its sessions go before the model */
    og_grammar_vocab_destroy(s->gvocab);
    og_tokenizer_destroy(s->tok);
    og_model_destroy(s->model);
    og_free(s->model_path);
    og_free(s->model_id);
    og_free(s->host);
    og_free(s->api_key);
    pthread_cond_destroy(&s->idle_cond);
    pthread_mutex_destroy(&s->lock);
    og_free(s);
}

og_status og_server_start(const og_serve_params *p, og_server **out) {
    if (!p || !out || !p->model_path) return og_set_error(OG_ERR_INVALID_ARGUMENT, "og_server_start: no model path");
    og_serve_params rp = *p;
    og_serve_resolve_params(&rp);
    if (rp.max_sessions < 1 || rp.max_queue < 0 || rp.chunk < 1 || rp.step_rows < 1 || rp.max_body < 1 ||
        rp.kv_budget < 0 || rp.prefix_cache_bytes < 0 || rp.port < 0 || rp.port > 65535 || rp.max_connections < 1 ||
        rp.max_connections_per_ip < 0 || !(rp.header_timeout_s > 0 && rp.header_timeout_s <= 86400) ||
        !(rp.write_timeout_s > 0 && rp.write_timeout_s <= 86400) || rp.min_body_rate < 1)
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "og_server_start: a parameter is out of range");
    og_server *s = og_calloc(1, sizeof *s);
    if (!s) return og_set_error(OG_ERR_OUT_OF_MEMORY, "serve: no memory");
    pthread_mutex_init(&s->lock, NULL);
    pthread_cond_init(&s->idle_cond, NULL);
    s->stopped = true; /* nothing to stop until it runs */
    s->p = rp;
    og_status st = OG_OK;
    s->model_path = og_strdup(p->model_path);
    s->model_id = p->model_id ? og_strdup(p->model_id) : model_id_of(p->model_path);
    s->host = og_strdup(p->host ? p->host : "127.0.0.1");
    s->api_key = p->api_key && *p->api_key ? og_strdup(p->api_key) : NULL;
    if (!s->model_path || !s->model_id || !s->host || (p->api_key && *p->api_key && !s->api_key)) {
        st = og_set_error(OG_ERR_OUT_OF_MEMORY, "serve: no memory");
        goto fail;
    }
    if ((st = og_model_load(p->model_path, &p->model, &s->model)) != OG_OK) {
        og_set_error(st, "cannot load %s: %s", p->model_path, og_last_error());
        goto fail;
    }
    if ((st = og_model_set_context(s->model, p->context)) != OG_OK) goto fail;
    if ((st = og_tokenizer_from_model(s->model, &s->tok)) != OG_OK) {
        og_set_error(st, "%s: %s", p->model_path, og_last_error());
        goto fail;
    }
    og_engine_params ep = og_engine_default_params(); /* from the resolved copy: max_sessions 0 is a default */
    ep.session = rp.session;
    ep.max_sessions = rp.max_sessions;
    ep.max_queue = rp.max_queue;
    ep.kv_budget = rp.kv_budget;
    ep.prefix_cache_bytes = rp.prefix_cache_bytes;
    ep.chunk = rp.chunk;
    ep.step_rows = rp.step_rows;
    ep.test_step_delay_s = rp.test_step_delay_s;
    ep.seed = rp.seed;
    if ((st = og_engine_create(s->model, s->tok, &ep, &s->engine)) != OG_OK) goto fail;
    s->ctx = og_engine_context(s->engine);
    s->api = (og_serve_ctx){.model_id = s->model_id, .vocab = og_model_vocab_size(s->model),
                            .tool_format = og_tool_format_detect(og_tokenizer_chat_template(s->tok))};
    /* without an end token no constrained output could end: response_format is then refused (http.c) */
    if (og_grammar_vocab_create(s->tok, og_model_vocab_size(s->model), NULL, 0, &s->gvocab) == OG_ERR_OUT_OF_MEMORY) {
        st = OG_ERR_OUT_OF_MEMORY;
        goto fail;
    }
    s->created = (int64_t)time(NULL);
    s->stopped = false;
    if ((st = og_http_start(s)) != OG_OK) goto fail;
    *out = s;
    return OG_OK;
fail:
    OG_RETURN_AFTER(st, og_server_destroy(s));
}

int32_t og_server_port(const og_server *s) { return s ? s->port : 0; }
const char *og_server_model_id(const og_server *s) { return s ? s->model_id : NULL; }
