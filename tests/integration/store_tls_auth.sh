#!/bin/sh
# musterd's store over TLS and with etcd's auth: one etcd member on loopback
# serving https only, with client certificates required
# (--client-cert-auth) and auth enabled (user muster may read and write
# /muster/ only), certificates from a throwaway CA made here with openssl.
#  - musterd with the CA, its client certificate and the user's password
#    leads, and its state is in etcd (read back as root);
#  - with a wrong password it does not lead and says authentication failed;
#  - without the CA file it does not lead and says the certificate could
#    not be checked;
#  - with the password over http:// it does not start (exit 2, saying why).
# Skipped with a message where etcd, etcdctl or openssl is not installed; a
# failure under CI, where mk/deps.sh build installs them.
set -eu
. tests/itest-lib.sh
. tests/etcd-cluster.sh

etcd_need store_tls_auth
for tool in openssl etcdctl; do
    command -v $tool > /dev/null && continue
    [ -n "${CI:-}" ] && fail "store_tls_auth: no $tool installed; mk/deps.sh build installs it for make check"
    echo "SKIP: store_tls_auth: no $tool"; exit 0
done
P=$ITEST_DIR/pki
mkdir -p "$P"
key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$P/$1.key" 2> /dev/null; }
key ca
openssl req -x509 -new -key "$P/ca.key" -out "$P/ca.crt" -days 1 -subj "/CN=muster test CA" 2> /dev/null
# The client's certificate has no CommonName: with auth on, etcd's JSON
# gateway refuses one (it would not be the user, the token is).
for who in server client; do
    key "$who"
    openssl req -new -key "$P/$who.key" -out "$P/$who.csr" -subj "/O=muster $who" 2> /dev/null
    printf 'subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth\n' > "$P/$who.ext"
    openssl x509 -req -in "$P/$who.csr" -CA "$P/ca.crt" -CAkey "$P/ca.key" -CAcreateserial -days 1 \
        -extfile "$P/$who.ext" -out "$P/$who.crt" 2> /dev/null
done
chmod 600 "$P"/*.key

C=$(free_port); PEER=$(free_port)
etcd --name t1 --data-dir "$ITEST_DIR/etcd-tls" \
    --listen-client-urls "https://127.0.0.1:$C" --advertise-client-urls "https://127.0.0.1:$C" \
    --listen-peer-urls "http://127.0.0.1:$PEER" --initial-advertise-peer-urls "http://127.0.0.1:$PEER" \
    --initial-cluster "t1=http://127.0.0.1:$PEER" --initial-cluster-state new \
    --cert-file "$P/server.crt" --key-file "$P/server.key" --trusted-ca-file "$P/ca.crt" --client-cert-auth \
    --log-level error > "$ITEST_DIR/etcd-tls.log" 2>&1 &
ITEST_PIDS="$ITEST_PIDS $!"
ctl() { ETCDCTL_API=3 etcdctl --endpoints "https://127.0.0.1:$C" --cacert "$P/ca.crt" --cert "$P/client.crt" \
    --key "$P/client.key" --dial-timeout 2s --command-timeout 5s "$@"; }
i=0; until ctl endpoint health > /dev/null 2>&1; do
    i=$((i + 1)); [ $i -lt 100 ] || fail "etcd with TLS did not serve within 20 s"; sleep 0.2; done
ctl user add root --new-user-password=rootpw --interactive=false > /dev/null
ctl user grant-role root root > /dev/null
ctl user add muster --new-user-password=musterpw --interactive=false > /dev/null
ctl role add muster > /dev/null
ctl role grant-permission muster --prefix=true readwrite /muster/ > /dev/null
ctl user grant-role muster muster > /dev/null
ctl auth enable > /dev/null
echo "etcd at https://127.0.0.1:$C: client certificates required, auth on (user muster: /muster/ only)"

make_token "$ITEST_DIR/token"
echo '{"name": "tls", "nodes": 1}' > "$ITEST_DIR/tls.json"
printf 'musterpw\n' > "$ITEST_DIR/pw-good"; printf 'nope\n' > "$ITEST_DIR/pw-bad"
chmod 600 "$ITEST_DIR"/pw-*
# musterd_tls NAME PASSWORD_FILE CA: musterd NAME with the store over TLS.
musterd_tls() {
    cat > "$ITEST_DIR/$1.conf.json" <<JSON
{"job": "$ITEST_DIR/tls.json", "listen": "127.0.0.1:$(free_port)", "http": "127.0.0.1:$(free_port)",
 "state_dir": "$ITEST_DIR/state-$1", "token_file": "$ITEST_DIR/token",
 "store": "https://127.0.0.1:$C", ${3:+\"store_ca_file\": \"$3\",}
 "store_cert_file": "$P/client.crt", "store_key_file": "$P/client.key",
 "store_user": "muster", "store_password_file": "$2"}
JSON
    "$BUILD/musterd" --config "$ITEST_DIR/$1.conf.json" >> "$ITEST_DIR/$1.log" 2>&1 &
    ITEST_PIDS="$ITEST_PIDS $!"
}
# A password over plain http: refused at start-up, before any request.
cat > "$ITEST_DIR/plain.conf.json" <<JSON
{"job": "$ITEST_DIR/tls.json", "listen": "127.0.0.1:0", "http": "127.0.0.1:0",
 "state_dir": "$ITEST_DIR/state-plain", "token_file": "$ITEST_DIR/token",
 "store": "http://127.0.0.1:$C", "store_user": "muster", "store_password_file": "$ITEST_DIR/pw-good"}
JSON
rc=0; timeout 10 "$BUILD/musterd" --config "$ITEST_DIR/plain.conf.json" > "$ITEST_DIR/plain.log" 2>&1 || rc=$?
[ "$rc" = 2 ] && grep -q "store_user: etcd's password would cross the network in the clear" "$ITEST_DIR/plain.log" \
    || fail "a password over http:// was not refused at start-up: rc $rc $(cat "$ITEST_DIR/plain.log")"
musterd_tls bad "$ITEST_DIR/pw-bad" "$P/ca.crt"
musterd_tls noca "$ITEST_DIR/pw-good" ""
wait_log 15 "$ITEST_DIR/bad.log" "authentication as 'muster' failed: .*invalid user ID or password" \
    || fail "a wrong password was not reported: $(tail -n 3 "$ITEST_DIR/bad.log")"
wait_log 15 "$ITEST_DIR/noca.log" "SSL certificate problem" \
    || fail "an unchecked server certificate was not reported: $(tail -n 3 "$ITEST_DIR/noca.log")"
musterd_tls good "$ITEST_DIR/pw-good" "$P/ca.crt"
wait_log 20 "$ITEST_DIR/good.log" "leading job tls" || fail "musterd with TLS and auth did not lead: $(tail -n 5 "$ITEST_DIR/good.log")"
i=0; until ctl --user root:rootpw get /muster/tls/state --print-value-only 2> /dev/null | grep -q '"job": *"tls"'; do
    i=$((i + 1)); [ $i -lt 100 ] || fail "the job's state did not reach etcd"; sleep 0.1; done
grep -q "leading job" "$ITEST_DIR/bad.log" "$ITEST_DIR/noca.log" && fail "a musterd led without valid credentials"
echo "store over TLS with auth: leads, state in etcd; wrong password and unknown CA refused"
