/* The echo server with no interpreter: what receiving and replying cost a compiled loop.

   cc -O2 -o echo echo.c /path/to/libzmq.so.5 -Wl,-rpath,/path/to   (compiled.py builds it)
   ./echo ENDPOINT

   It answers every request as baselines.py's echo server does: a 200 header
   with the request's id and one float32 [1,10] output, the model's reply
   size. Only the header's "id" is read (a number or a string without commas
   or braces, which is what infermux's load generator sends). It links the
   libzmq that pyzmq loads, so both echo servers use the same ZeroMQ build
   (zmq_abi.h). */
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "zmq_abi.h"

enum { KEPT = 3 };  /* identity, delimiter, header */

/* The header's id as JSON text (up to the next comma or brace), or null. */
static void request_id(zmq_msg_t *header, char *id, size_t room) {
    char text[1024];
    size_t n = zmq_msg_size(header) < sizeof text - 1 ? zmq_msg_size(header) : sizeof text - 1;
    memcpy(text, zmq_msg_data(header), n);
    text[n] = 0;
    const char *at = strstr(text, "\"id\":");
    if (!at) {
        snprintf(id, room, "null");
        return;
    }
    at += 5;
    while (*at == ' ')
        at++;
    size_t len = strcspn(at, ",}");
    snprintf(id, room, "%.*s", (int)(len < room - 1 ? len : room - 1), at);
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s ENDPOINT\n", argv[0]);
        return 2;
    }
    void *sock = zmq_socket(zmq_ctx_new(), ZMQ_ROUTER);
    if (zmq_bind(sock, argv[1]) != 0) {
        fprintf(stderr, "bind %s: %s\n", argv[1], zmq_strerror(zmq_errno()));
        return 1;
    }
    const float probs[10] = {0};
    for (;;) {
        zmq_msg_t kept[KEPT], rest;
        int n = 0, more = 1;
        while (more) {  /* every frame of the message; the tensors are not looked at */
            zmq_msg_t *part = n < KEPT ? &kept[n] : &rest;
            zmq_msg_init(part);
            if (zmq_msg_recv(part, sock, 0) < 0)
                return 1;
            more = zmq_msg_more(part);
            if (n++ >= KEPT)
                zmq_msg_close(part);
        }
        if (n < KEPT) {  /* no header: nothing to answer */
            for (int i = 0; i < n; i++)
                zmq_msg_close(&kept[i]);
            continue;
        }
        char id[64], header[256];
        request_id(&kept[2], id, sizeof id);
        int len = snprintf(header, sizeof header, "{\"id\":%s,\"status\":200,\"outputs\":[{\"name\":\"probs\","
                           "\"dtype\":\"float32\",\"shape\":[1,10]}]}", id);
        if (zmq_msg_send(&kept[0], sock, ZMQ_SNDMORE) < 0)  /* the identity, handed back */
            zmq_msg_close(&kept[0]);
        zmq_send(sock, "", 0, ZMQ_SNDMORE);
        zmq_send(sock, header, (size_t)len, ZMQ_SNDMORE);
        zmq_send(sock, probs, sizeof probs, 0);
        zmq_msg_close(&kept[1]);
        zmq_msg_close(&kept[2]);
    }
}
